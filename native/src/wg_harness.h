// Test exports' logic for the WireGuard protocol code (addon.cc only converts): the primitives
// on byte vectors, the replay window on a list of counters, and test devices on a manual clock
// that the tests move. Not used by the engine; allocates freely.
#ifndef WEFT_NATIVE_WG_HARNESS_H_
#define WEFT_NATIVE_WG_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft {
namespace wg {

using Bytes = std::vector<uint8_t>;

// One primitive by name (x25519, publicKey, seal, open, sealKeyed, openKeyed, xseal, xopen,
// hchacha20, hash, mac, mac32, hmac, kdf, initial, tai64n) on its arguments; false when the
// primitive refused (a forged AEAD input, a zero X25519 result). `error` is set for an unknown op
// or wrong argument sizes.
bool CryptoForTest(const std::string& op, const std::vector<Bytes>& args, Bytes* out,
                   std::string* error);

// Feeds the counters to one fresh replay window in order (with this limit): accepted or not.
std::vector<bool> ReplayForTest(const std::vector<uint64_t>& counters, uint64_t limit);

// Test devices, by id, each on its own manual clock.
struct TestPeerState {
  std::string handshake;  // zeroed, initiation_created, ...
  bool has_previous = false, has_current = false, has_next = false;
  bool current_initiator = false;
  uint64_t current_send_counter = 0;
  uint32_t attempts = 0;
  uint64_t next_deadline = 0;
  size_t indices = 0;  // the device's index table size
  Bytes endpoint;
};
struct TestReceived {
  std::string verdict;
  int peer = -1;
  Bytes packet;
};

int TestDeviceCreate(const Bytes& private_key, std::string* error);
bool TestDeviceClose(int id);
Bytes TestDevicePublicKey(int id);
// → the peer's number in this device, or −1.
int TestDeviceAddPeer(int id, const Bytes& public_key, const Bytes& psk, uint64_t keepalive_ns);
bool TestDeviceSetClock(int id, uint64_t mono_ns, uint64_t wall_ns);
bool TestDeviceSetUnderLoad(int id, bool on);
Bytes TestDeviceInitiate(int id, int peer);
// → the status name (ok, expired, too_short, forged, replayed) and the datagram.
std::string TestDeviceSend(int id, int peer, const Bytes& payload, size_t mtu, Bytes* packet);
TestReceived TestDeviceReceive(int id, const Bytes& packet, const Bytes& src);
// A transport message received in the engine's two halves (BeginOpen, the opening on a context
// of the caller's own, FinishOpen): `between` "expire" moves the clock past REJECT_AFTER_TIME
// and ticks the peer before FinishOpen, "twice" finishes the same opened message twice (two
// workers); → the verdict of each FinishOpen (or BeginOpen's, when it refused).
std::vector<std::string> TestDeviceReceiveSplit(int id, const Bytes& packet, const Bytes& src,
                                                const std::string& between);
// → the names of the actions due (send_initiation, send_keepalive, zero_keys, gave_up).
std::vector<std::string> TestDeviceTick(int id, int peer);
bool TestDevicePeerState(int id, int peer, TestPeerState* state);
bool TestDeviceSetSendCounter(int id, int peer, uint64_t counter);
// Removes a peer (its number is not reused).
bool TestDeviceRemovePeer(int id, int peer);

}  // namespace wg
}  // namespace weft

#endif  // WEFT_NATIVE_WG_HARNESS_H_
