#include "stoker/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "stoker/byte_size.h"

namespace stoker {

ProgressBar::ProgressBar(std::string label, std::string unit, std::uint64_t total, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(enabled),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::ProgressBar(std::string label, std::string unit, std::uint64_t total)
    : ProgressBar(std::move(label), std::move(unit), total, ::isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && !finished_ && done_ > 0) std::fputc('\n', stderr);
}

void ProgressBar::Update(std::uint64_t done, std::uint64_t bytes) {
  done_ = done;
  bytes_ = bytes;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw(false);
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  Draw(true);
  std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::Draw(bool final) {
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = seconds > 0 ? static_cast<double>(done_) / seconds : 0;
  double byte_rate = seconds > 0 ? static_cast<double>(bytes_) / seconds : 0;
  double fraction = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 24;
  int filled = static_cast<int>(fraction * kWidth);
  std::string bar =
      std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.');
  std::string eta = "--:--";
  if (final) {
    eta = fmt::format("{:.1f}s", seconds);
  } else if (rate > 0 && total_ >= done_) {
    auto left = static_cast<std::uint64_t>(static_cast<double>(total_ - done_) / rate);
    eta = fmt::format("ETA {}:{:02}", left / 60, left % 60);
  }
  // A bar that counts no bytes (shards indexed, MiB written) shows one rate.
  const std::string byte_rate_said =
      bytes_ > 0 ? fmt::format("  {}/s", FormatBytes(static_cast<std::uint64_t>(byte_rate))) : std::string();
  std::string line = fmt::format("\r{} [{}] {}/{} {} {:3.0f}%  {:.0f} {}/s{}  {}", label_, bar, done_, total_, unit_,
                                 fraction * 100, rate, unit_, byte_rate_said, eta);
  std::fputs(line.c_str(), stderr);
  std::fputs("\x1b[K", stderr);  // clear the rest of the line
  std::fflush(stderr);
}

}  // namespace stoker
