// stoker/progress.h: a one-line progress bar with rate and ETA, drawn on stderr only when it is
// a terminal (quiet in logs and pipes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace stoker {

class ProgressBar {
 public:
  // `unit` names what is counted ("samples", "shards").
  ProgressBar(std::string label, std::string unit, std::uint64_t total, bool enabled);
  // Same, enabled when stderr is a terminal.
  ProgressBar(std::string label, std::string unit, std::uint64_t total);
  ~ProgressBar();

  // Redraws at most ten times a second.
  void Update(std::uint64_t done, std::uint64_t bytes);
  // Draws the final state and ends the line.
  void Finish();

 private:
  void Draw(bool final);

  std::string label_, unit_;
  std::uint64_t total_, done_ = 0, bytes_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace stoker
