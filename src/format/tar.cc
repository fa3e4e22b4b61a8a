#include "format/tar.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

namespace stoker::tar {
namespace {

// ustar header field offsets and sizes.
constexpr std::size_t kNameOff = 0, kNameLen = 100;
constexpr std::size_t kModeOff = 100, kUidOff = 108, kGidOff = 116;
constexpr std::size_t kSizeOff = 124, kSizeLen = 12;
constexpr std::size_t kMtimeOff = 136;
constexpr std::size_t kChksumOff = 148, kChksumLen = 8;
constexpr std::size_t kTypeOff = 156;
constexpr std::size_t kMagicOff = 257;
constexpr std::size_t kPrefixOff = 345, kPrefixLen = 155;

std::string_view FieldString(std::span<const std::byte> block, std::size_t off, std::size_t len) {
  const char* p = reinterpret_cast<const char*>(block.data()) + off;
  return {p, strnlen(p, len)};
}

// Numeric header fields: octal text, or GNU base-256 when the top bit is set.
std::optional<std::uint64_t> ParseNumber(std::span<const std::byte> block, std::size_t off, std::size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(block.data()) + off;
  if (p[0] & 0x80) {
    if (p[0] & 0x40) return std::nullopt;  // negative
    std::uint64_t value = p[0] & 0x3f;
    for (std::size_t i = 1; i < len; ++i) {
      if (value >> 56) return std::nullopt;
      value = (value << 8) | p[i];
    }
    return value;
  }
  std::size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  std::uint64_t value = 0;
  bool any = false;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (value >> 61) return std::nullopt;
    value = value * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  if (!any) return std::nullopt;
  return value;
}

bool IsZeroBlock(std::span<const std::byte> block) {
  return std::all_of(block.begin(), block.end(), [](std::byte b) { return b == std::byte{0}; });
}

bool ChecksumMatches(std::span<const std::byte> block) {
  auto stored = ParseNumber(block, kChksumOff, kChksumLen);
  if (!stored) return false;
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;  // some old tars summed signed chars
  for (std::size_t i = 0; i < kBlockSize; ++i) {
    bool in_field = i >= kChksumOff && i < kChksumOff + kChksumLen;
    auto u = in_field ? static_cast<unsigned char>(' ') : static_cast<unsigned char>(block[i]);
    unsigned_sum += u;
    signed_sum += static_cast<signed char>(u);
  }
  return *stored == unsigned_sum || static_cast<std::int64_t>(*stored) == signed_sum;
}

// Parses pax records "LEN key=value\n" and returns the path, if any.
Result<std::optional<std::string>> ParsePaxPath(std::string_view records, std::string_view where,
                                                std::uint64_t offset) {
  std::optional<std::string> path;
  while (!records.empty()) {
    std::size_t space = records.find(' ');
    std::size_t len = 0;
    bool ok = space != std::string_view::npos && space > 0 && space <= 20;
    for (std::size_t i = 0; ok && i < space; ++i) {
      if (records[i] < '0' || records[i] > '9')
        ok = false;
      else
        len = len * 10 + static_cast<std::size_t>(records[i] - '0');
    }
    if (!ok || len <= space + 1 || len > records.size() || records[len - 1] != '\n') {
      // GNU tar pads pax data with NULs in some versions; tolerate trailing zeros.
      if (std::all_of(records.begin(), records.end(), [](char c) { return c == '\0'; })) break;
      return Status::Corruption(fmt::format("{}:{}: malformed pax extended header record", where, offset));
    }
    std::string_view record = records.substr(space + 1, len - space - 2);
    std::size_t eq = record.find('=');
    if (eq == std::string_view::npos)
      return Status::Corruption(fmt::format("{}:{}: pax record without '='", where, offset));
    if (record.substr(0, eq) == "path") path = std::string(record.substr(eq + 1));
    records.remove_prefix(len);
  }
  return path;
}

}  // namespace

Result<std::optional<Member>> Reader::Next() {
  if (done_) return std::optional<Member>();
  std::optional<std::string> long_name;  // from GNU 'L' or pax 'x'
  std::uint64_t first_header = offset_;
  const std::uint64_t total = archive_.size();
  while (true) {
    if (offset_ == total) {  // end of bytes at a block boundary: tolerated
      done_ = true;
      if (long_name)
        return Status::Corruption(fmt::format("{}:{}: archive ends after an extension header", where_, first_header));
      return std::optional<Member>();
    }
    if (total - offset_ < kBlockSize)
      return Status::Corruption(
          fmt::format("{}:{}: truncated tar header ({} bytes left, need 512)", where_, offset_, total - offset_));
    auto block = archive_.subspan(offset_, kBlockSize);
    if (IsZeroBlock(block)) {
      done_ = true;
      if (long_name)
        return Status::Corruption(fmt::format("{}:{}: archive ends after an extension header", where_, first_header));
      return std::optional<Member>();
    }
    if (!ChecksumMatches(block))
      return Status::Corruption(
          fmt::format("{}:{}: bad tar header checksum (not a tar archive, or corrupt)", where_, offset_));
    auto size = ParseNumber(block, kSizeOff, kSizeLen);
    if (!size) return Status::Corruption(fmt::format("{}:{}: bad size field in tar header", where_, offset_));
    const std::uint64_t header_offset = offset_;
    const std::uint64_t data_offset = offset_ + kBlockSize;
    if (*size > total - data_offset)
      return Status::Corruption(fmt::format("{}:{}: truncated tar member: header says {} bytes, only {} remain", where_,
                                            header_offset, *size, total - data_offset));
    const std::uint64_t next = data_offset + *size + PaddingAfter(*size);
    const char type = static_cast<char>(block[kTypeOff]);
    auto data = archive_.subspan(data_offset, *size);
    std::string_view data_text(reinterpret_cast<const char*>(data.data()), data.size());
    // A member's data is padded to a whole block; an archive that ends inside
    // that padding was cut short (its end-of-archive blocks are missing too).
    if (next > total)
      return Status::Corruption(
          fmt::format("{}:{}: truncated tar archive: it ends {} bytes into the padding after member data of {} bytes",
                      where_, header_offset, total - data_offset - *size, *size));
    offset_ = next;

    switch (type) {
      case 'L': {  // GNU long name: the data is the NUL-terminated name
        long_name = std::string(data_text.substr(0, strnlen(data_text.data(), data_text.size())));
        continue;
      }
      case 'x': {  // pax extended header for the next member
        STOKER_ASSIGN_OR_RETURN(auto pax_path, ParsePaxPath(data_text, where_, header_offset));
        if (pax_path) long_name = std::move(pax_path);
        continue;
      }
      case 'g':  // pax global header: nothing we use
      case 'K':  // GNU long link name: irrelevant for regular files
        continue;
      default:
        break;
    }

    Member member;
    if (long_name) {
      member.name = std::move(*long_name);
    } else {
      std::string_view name = FieldString(block, kNameOff, kNameLen);
      bool ustar = std::memcmp(block.data() + kMagicOff, "ustar", 5) == 0;
      std::string_view prefix = ustar ? FieldString(block, kPrefixOff, kPrefixLen) : std::string_view();
      member.name = prefix.empty() ? std::string(name) : fmt::format("{}/{}", prefix, name);
    }
    if (type == '0' || type == '\0' || type == '7') {
      member.type = MemberType::kRegular;
    } else if (type == '5') {
      member.type = MemberType::kDirectory;
    } else {
      member.type = MemberType::kOther;
    }
    member.header_offset = first_header;
    member.data_offset = data_offset;
    member.size = *size;
    return std::optional<Member>(std::move(member));
  }
}

namespace {

void WriteOctal(char* field, std::size_t len, std::uint64_t value) {
  // len-1 octal digits, zero-padded, NUL-terminated.
  for (std::size_t i = len - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[len - 1] = '\0';
}

void AppendUstarBlock(std::string& out, std::string_view name, std::string_view prefix, std::uint64_t size, char type) {
  std::array<char, kBlockSize> block{};
  std::copy(name.begin(), name.end(), block.data() + kNameOff);
  WriteOctal(block.data() + kModeOff, 8, 0644);
  WriteOctal(block.data() + kUidOff, 8, 0);
  WriteOctal(block.data() + kGidOff, 8, 0);
  if (size < (std::uint64_t{1} << 33)) {
    WriteOctal(block.data() + kSizeOff, kSizeLen, size);
  } else {  // GNU base-256 for members of 8 GiB and more
    auto* p = reinterpret_cast<unsigned char*>(block.data() + kSizeOff);
    for (std::size_t i = kSizeLen; i-- > 1;) {
      p[i] = static_cast<unsigned char>(size & 0xff);
      size >>= 8;
    }
    p[0] = 0x80;
  }
  WriteOctal(block.data() + kMtimeOff, 12, 0);
  block[kTypeOff] = type;
  constexpr std::string_view kUstarMagic(
      "ustar\0"
      "00",
      8);
  std::copy(kUstarMagic.begin(), kUstarMagic.end(), block.data() + kMagicOff);
  std::copy(prefix.begin(), prefix.end(), block.data() + kPrefixOff);
  std::memset(block.data() + kChksumOff, ' ', kChksumLen);
  unsigned sum = 0;
  for (char c : block) sum += static_cast<unsigned char>(c);
  // Checksum: six octal digits, NUL, space (as GNU tar writes it).
  WriteOctal(block.data() + kChksumOff, 7, sum);
  block[kChksumOff + 7] = ' ';
  out.append(block.data(), block.size());
}

}  // namespace

Status AppendFileHeader(std::string& out, std::string_view name, std::uint64_t size) {
  if (name.empty()) return Status::InvalidArgument("tar member name is empty");
  if (name.find('\0') != std::string_view::npos)
    return Status::InvalidArgument(fmt::format("tar member name '{}' contains a NUL byte", name));
  if (name.size() <= kNameLen) {
    AppendUstarBlock(out, name, {}, size, '0');
    return Status::Ok();
  }
  // Try ustar's prefix/name split at a '/'.
  for (std::size_t slash = name.find('/'); slash != std::string_view::npos; slash = name.find('/', slash + 1)) {
    if (slash <= kPrefixLen && name.size() - slash - 1 <= kNameLen && name.size() - slash - 1 > 0) {
      AppendUstarBlock(out, name.substr(slash + 1), name.substr(0, slash), size, '0');
      return Status::Ok();
    }
  }
  // A pax extended header carrying the path, then a ustar block with a truncated name.
  std::string body = fmt::format(" path={}\n", name);
  std::size_t len = body.size();
  // The length prefix counts its own digits.
  std::size_t digits = fmt::formatted_size("{}", len);
  while (fmt::formatted_size("{}", len + digits) != digits) ++digits;
  std::string record = fmt::format("{}{}", len + digits, body);
  AppendUstarBlock(out, "PaxHeaders/long-name", {}, record.size(), 'x');
  out.append(record);
  out.append(PaddingAfter(record.size()), '\0');
  AppendUstarBlock(out, name.substr(0, kNameLen), {}, size, '0');
  return Status::Ok();
}

}  // namespace stoker::tar
