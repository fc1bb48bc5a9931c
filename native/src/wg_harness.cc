#include "wg_harness.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "wg_crypto.h"
#include "wg_device.h"
#include "wg_noise.h"
#include "wg_session.h"

namespace weft {
namespace wg {

namespace {

bool Sizes(const std::vector<Bytes>& args, std::initializer_list<int> sizes, std::string* error) {
  if (args.size() != sizes.size()) {
    *error = "wrong number of arguments";
    return false;
  }
  size_t i = 0;
  for (int s : sizes) {
    if (s >= 0 && args[i].size() != size_t(s)) {
      *error = "argument " + std::to_string(i) + " must be " + std::to_string(s) + " bytes";
      return false;
    }
    i++;
  }
  return true;
}

class ManualClock : public Clock {
 public:
  uint64_t MonotonicNs() const override { return mono; }
  uint64_t WallNs() const override { return wall; }
  uint64_t mono = kSecond;
  uint64_t wall = 1700000000ull * kSecond;
};

struct TestDevice {
  ManualClock clock;
  Device device{&clock};
  std::vector<Peer*> peers;
};

std::mutex g_mu;
std::map<int, std::unique_ptr<TestDevice>> g_devices;
int g_next_id = 1;

TestDevice* Find(int id) {
  auto it = g_devices.find(id);
  return it == g_devices.end() ? nullptr : it->second.get();
}

Peer* FindPeer(TestDevice* d, int peer) {
  return d && peer >= 0 && size_t(peer) < d->peers.size() ? d->peers[peer] : nullptr;
}

int PeerNumber(TestDevice* d, const Peer* p) {
  for (size_t i = 0; i < d->peers.size(); i++) {
    if (d->peers[i] == p) return int(i);
  }
  return -1;
}

const char* StatusName(TransportStatus s) {
  switch (s) {
    case TransportStatus::kOk:
      return "ok";
    case TransportStatus::kExpired:
      return "expired";
    case TransportStatus::kTooShort:
      return "too_short";
    case TransportStatus::kForged:
      return "forged";
    case TransportStatus::kReplayed:
      return "replayed";
  }
  return "unknown";
}

const char* StateName(Handshake::State s) {
  switch (s) {
    case Handshake::State::kZeroed:
      return "zeroed";
    case Handshake::State::kInitiationCreated:
      return "initiation_created";
    case Handshake::State::kInitiationConsumed:
      return "initiation_consumed";
    case Handshake::State::kResponseCreated:
      return "response_created";
    case Handshake::State::kResponseConsumed:
      return "response_consumed";
  }
  return "unknown";
}

}  // namespace

bool CryptoForTest(const std::string& op, const std::vector<Bytes>& args, Bytes* out,
                   std::string* error) {
  CryptoContext c;
  if (!c.ok()) {
    *error = "libcrypto lacks an algorithm";
    return false;
  }
  const int k = int(kKeyLen);
  if (op == "x25519") {
    if (!Sizes(args, {k, k}, error)) return false;
    out->resize(kKeyLen);
    return X25519(out->data(), args[0].data(), args[1].data());
  }
  if (op == "publicKey") {
    if (!Sizes(args, {k}, error)) return false;
    out->resize(kKeyLen);
    return PublicKey(out->data(), args[0].data());
  }
  if (op == "seal" || op == "open" || op == "xseal" || op == "xopen") {
    bool x = op[0] == 'x';
    bool seal = op == "seal" || op == "xseal";
    if (!Sizes(args, {k, int(x ? kXNonceLen : kNonceLen), -1, -1}, error)) return false;
    const Bytes& in = args[3];
    if (!seal && in.size() < kTagLen) return false;
    out->resize(seal ? in.size() + kTagLen : in.size() - kTagLen);
    const uint8_t* ad = args[2].data();
    if (x) {
      return seal ? c.XSeal(out->data(), args[0].data(), args[1].data(), in.data(), in.size(), ad,
                            args[2].size())
                  : c.XOpen(out->data(), args[0].data(), args[1].data(), in.data(), in.size(), ad,
                            args[2].size());
    }
    return seal ? c.Seal(out->data(), args[0].data(), args[1].data(), in.data(), in.size(), ad,
                         args[2].size())
                : c.Open(out->data(), args[0].data(), args[1].data(), in.data(), in.size(), ad,
                         args[2].size());
  }
  // One keyed context (AeadKey) over a list of counters (args[1]: 8 bytes little-endian each):
  // sealKeyed seals args[2] under each counter, the results concatenated; openKeyed opens the
  // equal-size messages concatenated in args[2] in turn, each result one status byte (1 opened,
  // 0 refused) then its plaintext (zeros when refused).
  if (op == "sealKeyed" || op == "openKeyed") {
    const bool seal = op == "sealKeyed";
    if (!Sizes(args, {k, -1, -1}, error)) return false;
    const size_t count = args[1].size() / 8;
    if (args[1].size() % 8 != 0 || count == 0) {
      *error = "counters must be 8 bytes each";
      return false;
    }
    const Bytes& in = args[2];
    const size_t each = seal ? in.size() : in.size() / count;
    if ((!seal && (in.size() % count != 0 || each < kTagLen))) {
      *error = "messages must be equal-size, each with a tag";
      return false;
    }
    AeadKey key;
    if (!key.Init(args[0].data(), seal)) return false;
    out->clear();
    for (size_t i = 0; i < count; i++) {
      const uint64_t counter = GetLe64(args[1].data() + 8 * i);
      if (seal) {
        Bytes m(each + kTagLen);
        if (!key.SealCounter(m.data(), counter, in.data(), each)) return false;
        out->insert(out->end(), m.begin(), m.end());
      } else {
        Bytes m(each - kTagLen);
        const bool ok = key.OpenCounter(m.data(), counter, in.data() + i * each, each);
        out->push_back(ok ? 1 : 0);
        out->insert(out->end(), m.begin(), m.end());
      }
    }
    return true;
  }
  if (op == "hchacha20") {
    if (!Sizes(args, {k, 16}, error)) return false;
    out->resize(kKeyLen);
    HChaCha20(out->data(), args[0].data(), args[1].data());
    return true;
  }
  if (op == "hash") {
    if (!Sizes(args, {-1}, error)) return false;
    out->resize(kHashLen);
    return c.Hash(out->data(), args[0].data(), args[0].size());
  }
  if (op == "mac" || op == "hmac") {
    if (!Sizes(args, {-1, -1}, error)) return false;
    out->resize(op == "mac" ? kMacLen : kHashLen);
    return op == "mac"
               ? c.Mac(out->data(), args[0].data(), args[0].size(), args[1].data(), args[1].size())
               : c.Hmac(out->data(), args[0].data(), args[0].size(), args[1].data(),
                        args[1].size());
  }
  if (op == "mac32") {
    if (!Sizes(args, {-1, -1}, error)) return false;
    out->resize(kHashLen);
    return KeyedBlake2s(out->data(), kHashLen, args[0].data(), args[0].size(), args[1].data(),
                        args[1].size());
  }
  if (op == "kdf") {
    if (!Sizes(args, {k, -1}, error)) return false;
    out->resize(3 * kHashLen);
    return c.Kdf(out->data(), out->data() + kHashLen, out->data() + 2 * kHashLen, args[0].data(),
                 args[1].data(), args[1].size());
  }
  if (op == "initial") {
    if (!Sizes(args, {}, error)) return false;
    out->assign(InitialChainKey(), InitialChainKey() + kHashLen);
    out->insert(out->end(), InitialHash(), InitialHash() + kHashLen);
    return true;
  }
  if (op == "tai64n") {
    if (!Sizes(args, {8}, error)) return false;
    out->resize(kTimestampLen);
    Tai64n(out->data(), GetLe64(args[0].data()));
    return true;
  }
  *error = "unknown op " + op;
  return false;
}

std::vector<bool> ReplayForTest(const std::vector<uint64_t>& counters, uint64_t limit) {
  auto window = std::make_unique<ReplayWindow>();
  std::vector<bool> out;
  for (uint64_t c : counters) out.push_back(window->Check(c, limit));
  return out;
}

int TestDeviceCreate(const Bytes& private_key, std::string* error) {
  if (!CryptoInit(error)) return -1;
  if (private_key.size() != kKeyLen) {
    *error = "private key must be 32 bytes";
    return -1;
  }
  auto d = std::make_unique<TestDevice>();
  if (!d->device.ok() || !d->device.SetPrivateKey(private_key.data())) {
    *error = "private key refused";
    return -1;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  int id = g_next_id++;
  g_devices[id] = std::move(d);
  return id;
}

bool TestDeviceClose(int id) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_devices.erase(id) > 0;
}

Bytes TestDevicePublicKey(int id) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  if (!d) return {};
  return Bytes(d->device.public_key(), d->device.public_key() + kKeyLen);
}

int TestDeviceAddPeer(int id, const Bytes& public_key, const Bytes& psk, uint64_t keepalive_ns) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  if (!d || public_key.size() != kKeyLen || (!psk.empty() && psk.size() != kKeyLen)) return -1;
  Peer* p = d->device.AddPeer(public_key.data(), psk.empty() ? nullptr : psk.data(), keepalive_ns);
  if (!p) return -1;
  d->peers.push_back(p);
  return int(d->peers.size() - 1);
}

bool TestDeviceSetClock(int id, uint64_t mono_ns, uint64_t wall_ns) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  if (!d) return false;
  d->clock.mono = mono_ns;
  d->clock.wall = wall_ns;
  return true;
}

bool TestDeviceSetUnderLoad(int id, bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  if (!d) return false;
  d->device.set_under_load(on);
  return true;
}

Bytes TestDeviceInitiate(int id, int peer) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  if (!p) return {};
  Bytes out(kInitiationSize);
  out.resize(d->device.CreateInitiation(p, out.data()));
  return out;
}

std::string TestDeviceSend(int id, int peer, const Bytes& payload, size_t mtu, Bytes* packet) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  if (!p) return "no_peer";
  packet->resize(payload.size() + kTransportHeaderSize + kTagLen + kPaddingMultiple);
  size_t n = 0;
  TransportStatus st =
      d->device.Send(p, payload.data(), payload.size(), packet->data(), packet->size(), &n, mtu);
  packet->resize(st == TransportStatus::kOk ? n : 0);
  return StatusName(st);
}

TestReceived TestDeviceReceive(int id, const Bytes& packet, const Bytes& src) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestReceived r;
  TestDevice* d = Find(id);
  if (!d) {
    r.verdict = "no_device";
    return r;
  }
  Bytes out(packet.size() + kInitiationSize);
  Received got = d->device.Receive(packet.data(), packet.size(), src.data(), src.size(), out.data(),
                                   out.size());
  r.verdict = VerdictName(got.verdict);
  r.peer = got.peer ? PeerNumber(d, got.peer) : -1;
  if (got.send() || got.verdict == Verdict::kData)
    r.packet.assign(out.data(), out.data() + got.len);
  return r;
}

std::vector<std::string> TestDeviceReceiveSplit(int id, const Bytes& packet, const Bytes& src,
                                                const std::string& between) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  if (!d) return {"no_device"};
  OpenTicket t;
  Received r;
  if (!d->device.BeginOpen(packet.data(), packet.size(), &t, &r)) return {VerdictName(r.verdict)};
  // A worker's own context, keyed from the ticket (as the engine's loops key theirs).
  AeadKey key;
  const size_t body = packet.size() - kTransportHeaderSize;
  Bytes out(body);
  const bool opened =
      key.Init(t.key, false) &&
      key.OpenCounter(out.data(), t.counter, packet.data() + kTransportHeaderSize, body);
  if (between == "expire" && r.peer != nullptr) {
    // Its key pair expires and goes while the worker opens the message.
    d->clock.mono += kRejectAfterTime;
    d->clock.wall += kRejectAfterTime;
    d->device.Tick(r.peer);
  }
  std::vector<std::string> verdicts;
  const int finishes = between == "twice" ? 2 : 1;  // two workers opened the same message
  for (int i = 0; i < finishes; i++) {
    verdicts.push_back(VerdictName(
        d->device.FinishOpen(t, opened, out.data(), body - kTagLen, src.data(), src.size())
            .verdict));
  }
  return verdicts;
}

std::vector<std::string> TestDeviceTick(int id, int peer) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  std::vector<std::string> out;
  if (!p) return out;
  uint32_t due = d->device.Tick(p);
  if (due & PeerTimers::kSendInitiation) out.push_back("send_initiation");
  if (due & PeerTimers::kSendKeepalive) out.push_back("send_keepalive");
  if (due & PeerTimers::kZeroKeys) out.push_back("zero_keys");
  if (due & PeerTimers::kGaveUp) out.push_back("gave_up");
  return out;
}

bool TestDevicePeerState(int id, int peer, TestPeerState* s) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  if (!p) return false;
  s->handshake = StateName(p->handshake().state);
  s->has_previous = p->previous() != nullptr;
  s->has_current = p->current() != nullptr;
  s->has_next = p->next() != nullptr;
  s->current_initiator = p->current() && p->current()->is_initiator;
  s->current_send_counter = p->current() ? p->current()->send_counter.load() : 0;
  s->attempts = p->timers().handshake_attempts();
  s->next_deadline = d->device.NextDeadline(p);
  s->indices = d->device.index_count();
  s->endpoint.assign(p->endpoint(), p->endpoint() + p->endpoint_len());
  return true;
}

bool TestDeviceSetSendCounter(int id, int peer, uint64_t counter) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  if (!p || !p->current()) return false;
  const_cast<Keypair*>(p->current())->send_counter.store(counter);
  return true;
}

bool TestDeviceRemovePeer(int id, int peer) {
  std::lock_guard<std::mutex> lock(g_mu);
  TestDevice* d = Find(id);
  Peer* p = FindPeer(d, peer);
  if (!p) return false;
  d->device.RemovePeer(p);
  d->peers[peer] = nullptr;
  return true;
}

}  // namespace wg
}  // namespace weft
