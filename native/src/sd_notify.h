// systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram of
// newline-separated KEY=VALUE assignments to the AF_UNIX SOCK_DGRAM socket in $NOTIFY_SOCKET.
// Node has no unix datagram sockets, and a helper process (systemd-notify) is not reliable:
// systemd attributes a message to a unit through the sender's pid, which must be the main pid
// (NotifyAccess=main) and still alive when systemd reads it. So the daemon sends it itself.
#ifndef WEFT_NATIVE_SD_NOTIFY_H_
#define WEFT_NATIVE_SD_NOTIFY_H_

#include <string>

namespace weft {

// Sends `state` (e.g. "READY=1") to `socket_path`: a filesystem path, or an abstract socket
// when it starts with '@' (the '@' becomes a leading NUL, as in systemd). Returns 0 on success
// or an errno (EINVAL for an empty or too-long path).
int SdNotify(const std::string& socket_path, const std::string& state);

}  // namespace weft

#endif  // WEFT_NATIVE_SD_NOTIFY_H_
