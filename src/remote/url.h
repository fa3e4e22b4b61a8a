// Remote locations as URLs: which are remote, how a dataset folder's URL
// becomes its index's, how shards are found beside the index (a query
// string, such as an access token, kept on each), and the request template
// (timeouts, and for s3:// the endpoint and AWS Signature V4).
#pragma once

#include <string>
#include <string_view>

#include "remote/http.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker::remote {

[[nodiscard]] bool IsRemoteUrl(std::string_view location);
// The index of the dataset at `location`: the URL itself when its path ends
// in ".stoker", else "<path>/index.stoker", the query string kept after it.
[[nodiscard]] std::string IndexUrl(std::string_view location);
// `name` beside the object `url` names (an absolute URL `name` as it is),
// with `url`'s query string.
[[nodiscard]] std::string SiblingUrl(std::string_view url, std::string_view name);
// http(s) as is; s3://BUCKET/KEY signed for the configured endpoint.
[[nodiscard]] Result<HttpRequest> RequestFor(const std::string& location, const RemoteOptions& options);
[[nodiscard]] RetryPolicy RetryFor(const RemoteOptions& options);

}  // namespace stoker::remote
