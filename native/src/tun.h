// TUN queues: IFF_TUN | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE. Every read starts and every
// write must start with a 10-byte virtio_net_hdr (packet.h), zeroed for a plain packet.
#ifndef WEFT_NATIVE_TUN_H_
#define WEFT_NATIVE_TUN_H_

#include <cstdint>
#include <string>

#include "offloads.h"  // kTunF*

namespace weft {

// Opens one queue of the TUN device `name` (created by the first queue; it lives while any
// queue is open). Non-blocking, close-on-exec. Returns the fd, or -errno with `error` set.
// `actual_name` receives the kernel's name for the device.
int OpenTunQueue(const std::string& name, std::string* actual_name, std::string* error);

// A single-queue TUN without the vnet header (IFF_TUN | IFF_NO_PI), non-blocking: the js
// engine's device. Returns the fd or -errno with `error` set.
int OpenPlainTun(const std::string& name, std::string* actual_name, std::string* error);

// Opens the egress TAP `name` ("" lets the kernel pick; *actual_name gets it): IFF_TAP |
// IFF_NO_PI | IFF_VNET_HDR with the 24-byte tunnel vnet header and TUNSETOFFLOAD CSUM, TSO4/6
// and UDP tunnel GSO (+ CSUM), which kernels before 6.17 refuse; `mac` gets the TAP's MAC.
// Returns the fd, or -errno with `error` naming the step that failed.
int OpenEgressTap(const std::string& name, std::string* actual_name, uint8_t mac[6],
                  std::string* error);
// TUNSETPERSIST on the device behind `fd`: with `persist` it outlives its last queue (and the
// process), keeping its addresses and routes; without, it goes with its last queue. Returns 0 or
// an errno with `error` set.
int SetTunPersist(int fd, bool persist, std::string* error);

// Tries each offload set in turn on `fd` (the device's offloads are shared by its queues) and
// returns the TUN_F_* bits the kernel accepted; leaves the device with `enable` & accepted.
unsigned ProbeTunOffloads(int fd, unsigned enable);

}  // namespace weft

#endif  // WEFT_NATIVE_TUN_H_
