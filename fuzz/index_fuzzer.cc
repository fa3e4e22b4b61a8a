// Fuzzes the index reader: Open() and every record access over arbitrary
// bytes. Each input is tried twice: as it is (which the header checksum
// usually rejects), and with the header checksum recomputed, so that the
// structural checks behind it are exercised too.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "format/index_format.h"
#include "format/index_note.h"
#include "format/index_writer.h"

namespace {

void Exercise(std::span<const std::byte> bytes) {
  auto view = stoker::index_format::IndexView::Open(bytes, "fuzz.stoker");
  if (!view.ok()) return;
  std::vector<std::uint32_t> table;
  for (std::uint64_t i = 0; i < view->num_samples() && i < 10000; ++i) {
    auto rec = view->record(i);
    if (!rec.ok()) continue;
    for (std::size_t f = 0; f < view->field_names().size(); ++f) (void)rec->field(f);
    volatile char sink = rec->key.empty() ? 0 : rec->key.back();  // the key must be readable
    (void)sink;
    for (std::uint32_t f = 0; f < view->field_names().size() && f < 4; ++f) {
      // A seekable JPEG's restart table: decoded within the section, or refused; its region record
      // (version 7) only when it fits the table.
      stoker::RegionRecord region;
      if (view->restart_table(i, f, table, &region)) {
        volatile std::uint32_t last = table.back();
        (void)last;
        if (region.rows() > 0) {
          if ((table.size() - 1) % region.rows() != 0) __builtin_trap();
          volatile std::uint64_t row = region.RowStart(table, region.rows() - 1, UINT64_MAX);
          (void)row;
        }
      }
    }
  }
  // The restart section in its own order (what a merge copies): each entry as the lookup by (sample, field) gives it.
  std::vector<std::uint32_t> looked_up;
  for (std::uint64_t e = 0; e < view->num_restart_tables() && e < 10000; ++e) {
    std::uint64_t sample = 0;
    std::uint32_t field = 0;
    stoker::RegionRecord region;
    if (!view->restart_table_at(e, &sample, &field, table, &region)) continue;
    if (region.rows() > 0 && (table.size() - 1) % region.rows() != 0) __builtin_trap();
    if (view->restart_table(sample, field, looked_up) && looked_up.empty()) __builtin_trap();
    // As a merge reads it: the bytes it takes, and its shortest encoding, which decodes to the same table.
    std::span<const std::byte> stored;
    if (!view->restart_table_at(e, &sample, &field, table, region, stored)) __builtin_trap();
    if (stored.empty() || region.rows() == 0) continue;
    if (view->restart_table_bytes(e, stored.size()).data() != stored.data()) __builtin_trap();
    std::vector<std::byte> shortest;
    stoker::index_format::AppendRestartTable(table, region, shortest);
    if (shortest.size() > stored.size()) __builtin_trap();
    std::size_t used = 0;
    if (!stoker::index_format::ReadRestartVarints(shortest, static_cast<std::uint32_t>(table.size()), looked_up,
                                                  &used) ||
        looked_up != table)
      __builtin_trap();
  }
  // A merge's note from this one's, twice and beside none.
  const std::string_view notes[] = {view->note(), view->note(), {}};
  const std::string where[] = {"a", "b", "c"};
  auto merged = stoker::index_format::MergedNote(notes, where);
  if (merged.ok() && merged->size() > stoker::index_format::kMaxNoteBytes) __builtin_trap();
  // What the loader reads of a note: kept bad images (--keep-bad-images), the class names.
  (void)stoker::index_format::BadImagesInNote(view->note());
  (void)stoker::index_format::ClassNamesInNote(view->note());
  if (merged.ok()) (void)stoker::index_format::BadImagesInNote(*merged);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace idx = stoker::index_format;
  // Copy into 8-aligned memory, as an mmap would be.
  std::vector<std::uint64_t> aligned((size + 7) / 8);
  if (size > 0) std::memcpy(aligned.data(), data, size);
  auto* bytes = reinterpret_cast<std::byte*>(aligned.data());
  Exercise({bytes, size});
  if (size >= idx::kHeaderSize) {
    auto records = idx::Load<std::uint64_t>(bytes + idx::header::kRecordsOff);
    if (records >= idx::kHeaderSize && records <= size) {
      std::uint64_t sum = idx::MetaChecksum({bytes, records});
      std::memcpy(bytes + idx::header::kMetaChecksumOff, &sum, sizeof(sum));
      Exercise({bytes, size});
    }
  }
  return 0;
}
