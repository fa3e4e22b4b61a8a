// Built without libcurl: remote locations report why.
#include "remote/http.h"

namespace stoker::remote {

std::unique_ptr<HttpTransport> MakeCurlTransport(std::string* why) {
  if (why) *why = "stoker was built without libcurl (install libcurl4-openssl-dev and rebuild)";
  return nullptr;
}

}  // namespace stoker::remote
