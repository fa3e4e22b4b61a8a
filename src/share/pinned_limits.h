// Limits an operator pins for every process of a node or a container, in a
// root-owned file that users cannot change: /etc/stoker/gpu-limits (the
// device plugin mounts one read-only into each container it serves). The
// environment alone can be cleared (`env -i`, a launcher that starts
// workers with a clean environment) and a job would run unlimited; the
// file applies whatever the environment says. With /etc/ld.so.preload
// naming the interposer (the device plugin's --enforce-preload), every
// process of the container is held, whatever its environment.
//
// Every regular file in /etc/stoker/gpu-limits.d/ applies too (in name
// order; the device plugin mounts one per resource it grants a container).
// A file: KEY=VALUE lines with the STOKER_GPU_* names of share_config.h,
// '#' comments, blank lines. Values set there win over the environment's,
// except that the environment may tighten a memory limit or the compute
// share (never loosen them).
//
// Plain C++ and the C library: this runs inside the interposer.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "share/share_config.h"

namespace stoker::share {

inline constexpr char kPinnedLimitsPath[] = "/etc/stoker/gpu-limits";

using PinnedValues = std::vector<std::pair<std::string, std::string>>;

// Reads the file at `path`. True with `*present` false when there is none.
// False with `*error` (naming the file and the line) when it is not to be
// trusted (not owned by root, or writable by anyone but its owner; the same
// for its folder) or does not parse.
bool ReadPinnedLimits(const std::string& path, PinnedValues* values, bool* present, std::string* error);

// The configuration a process runs under: the environment (`env`), with the
// pinned file at `pinned_path` and those in `pinned_path`.d/ on top.
// `config->pinned_from` names the files that applied.
bool EffectiveShareConfig(const std::function<const char*(const char*)>& env, const std::string& pinned_path,
                          ShareConfig* config, std::string* error);

}  // namespace stoker::share
