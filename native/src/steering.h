// TUN queue steering (TUNSETSTEERINGEBPF): a tiny socket-filter program the kernel runs for each
// packet routed into the TUN; its return value modulo the number of queues picks the queue.
// Without one, the TUN picks by its flow table, which it updates from the queue that last wrote
// a flow's packets: a new TCP connection's first reply, received by the queue the peer's
// SO_REUSEPORT group picked, moves the flow to that queue once, and TCP sees reordering.
#ifndef WEFT_NATIVE_STEERING_H_
#define WEFT_NATIVE_STEERING_H_

#include <cstdint>
#include <string>

namespace weft {

enum class Steering {
  kFlowHash,  // skb->hash (the sending socket's txhash), else inner src ^ dst address: a flow
              // stays on one queue for its life
  kCpu,       // the current CPU (the queue whose thread is pinned to it: CPU-affine queues) when
              // a flow starts or resumes after a pause of `gap_ns`; in between, the queue the
              // flow has: a TCP flow is sent from two CPUs (the application's, and the one its
              // ACKs come in on), and by CPU alone its packets took two queues and arrived
              // reordered (measured: 40,000-60,000 retransmitted segments per 2 GB one stream)
};

// Loads the program and attaches it to the TUN device behind `tun_fd` (every queue shares it).
// `gap_ns` is kCpu's pause. Returns 0, or an errno with `error` set (the TUN then keeps its
// flow-table steering).
int AttachSteering(int tun_fd, Steering kind, uint64_t gap_ns, std::string* error);

// Detaches whatever steering program the device behind `tun_fd` carries (one an earlier engine
// left on a persistent device); best effort.
void DetachSteering(int tun_fd);

}  // namespace weft

#endif  // WEFT_NATIVE_STEERING_H_
