// Built without gRPC: the device plugin cannot speak to the kubelet.
#include "kube/device_plugin.h"

namespace stoker::kube {

class DevicePlugin::Impl {};

Result<std::unique_ptr<DevicePlugin>> DevicePlugin::Start(DevicePluginOptions) {
  return Status::Unimplemented(
      "this stoker was built without gRPC (libgrpc++-dev, protobuf-compiler-grpc): "
      "the device plugin is not available");
}
DevicePlugin::DevicePlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DevicePlugin::~DevicePlugin() = default;
int DevicePlugin::status_port() const {
  return 0;
}
Result<std::string> DevicePlugin::CardsJson() {
  return Status::Unimplemented("built without gRPC");
}

}  // namespace stoker::kube
