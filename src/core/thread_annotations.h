// Clang thread-safety annotations (no-ops elsewhere). See
// https://clang.llvm.org/docs/ThreadSafetyAnalysis.html
#pragma once

#if defined(__clang__)
#define STOKER_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define STOKER_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) STOKER_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY STOKER_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) STOKER_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) STOKER_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) STOKER_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) STOKER_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) STOKER_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define EXCLUDES(...) STOKER_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS STOKER_THREAD_ANNOTATION_(no_thread_safety_analysis)
