// The start of every hook: the real function (or CUDA_ERROR_NOT_FOUND when
// the driver lacks it: never a call through NULL) and a usable interposer
// (or its refusal).
#pragma once

#include "share/interposer/entry_points.h"
#include "share/interposer/interposer.h"

#define STOKER_PROLOGUE(variant, pfn)                                    \
  auto real = ::stoker::share::Real<pfn>(::stoker::share::kV_##variant); \
  if (real == nullptr) return CUDA_ERROR_NOT_FOUND;                      \
  ::stoker::share::Interposer& ip = ::stoker::share::Interposer::Get();  \
  if (!ip.ok()) return ip.Refuse();
