// The only file that includes napi.h: it converts arguments, checks them and maps errors.
// Packet and netlink logic live in plain C++ files beside it.
#include <napi.h>

#include <libmnl/libmnl.h>

namespace weft {

class Addon : public Napi::Addon<Addon> {
 public:
  Addon(Napi::Env env, Napi::Object exports) {
    DefineAddon(exports, {
                             InstanceMethod("version", &Addon::Version),
                         });
  }

 private:
  Napi::Value Version(const Napi::CallbackInfo& info) {
    // The netlink socket type is referenced so the libmnl link is exercised at load time.
    (void)&mnl_socket_open;
    return Napi::String::New(info.Env(), "weft-native 0.1.0");
  }
};

}  // namespace weft

NODE_API_ADDON(weft::Addon)
