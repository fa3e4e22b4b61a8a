#include "checkpoint/sharded_manifest.h"

#include <algorithm>
#include <charconv>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace stoker::checkpoint {
namespace {

using Json = nlohmann::json;

std::string Hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

std::uint64_t ParseHex64OrThrow(const Json& j) {
  const auto s = j.get<std::string>();
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size())
    throw std::invalid_argument("malformed xxh3 '" + s + "'");
  return v;
}

Json EncodeBlocks(const BlockHashes& blocks) {
  Json out = Json::object();
  for (const auto& [file, hashes] : blocks) {
    Json list = Json::array();
    for (auto h : hashes) list.push_back(Hex64(h));
    out[file] = std::move(list);
  }
  return out;
}

BlockHashes DecodeBlocks(const Json& j) {
  BlockHashes out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto& hashes = out[it.key()];
    for (const auto& h : it.value()) hashes.push_back(ParseHex64OrThrow(h));
  }
  return out;
}

TensorDType DTypeOrThrow(const Json& j) {
  const auto name = j.get<std::string>();
  auto dtype = ParseTensorDType(name);
  if (!dtype) throw std::invalid_argument("unknown dtype '" + name + "'");
  return *dtype;
}

bool PlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && !name.starts_with(".");
}

std::uint64_t Volume(std::span<const std::uint64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
}

bool Overlap(const ShardPiece& a, const ShardPiece& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.shape[d] <= b.offsets[d] || b.offsets[d] + b.shape[d] <= a.offsets[d]) return false;
  }
  return true;
}

}  // namespace

std::string RankStem(std::uint32_t rank) {
  return fmt::format("rank-{:05d}", rank);
}
std::string RankPartName(std::uint32_t rank) {
  return RankStem(rank) + ".json";
}
std::string RankFailedName(std::uint32_t rank) {
  return RankStem(rank) + ".failed";
}
std::string ShardedTempName(std::int64_t step, std::string_view save_id) {
  return fmt::format("{}sharded-step-{}-{}", kTempPrefix, step, save_id);
}
bool ValidSaveId(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

Result<std::string> EncodeRankPart(const RankPart& part) {
  Json pieces = Json::array();
  for (const auto& p : part.pieces)
    pieces.push_back(
        Json::array({p.name, p.file, TensorDTypeName(p.dtype), p.global_shape, p.offsets, p.shape, p.begin}));
  Json sharded = {{"rank", part.rank},
                  {"world_size", part.world_size},
                  {"save_id", part.save_id},
                  {"block_bytes", part.block_bytes},
                  {"blocks", EncodeBlocks(part.blocks)},
                  {"pieces", std::move(pieces)}};
  Manifest base = part.base;
  base.sharded_json = sharded.dump();
  return EncodeManifest(base);
}

Result<RankPart> DecodeRankPart(std::string_view text, std::string_view path) {
  STOKER_ASSIGN_OR_RETURN(Manifest base, DecodeManifest(text, path));
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("rank manifest '{}': {}", path, what));
  };
  if (base.sharded_json.empty()) return bad("it has no \"sharded\" member");
  Json j = Json::parse(base.sharded_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("its \"sharded\" member is not a JSON object");
  RankPart part;
  try {
    part.rank = j.at("rank").get<std::uint32_t>();
    part.world_size = j.at("world_size").get<std::uint32_t>();
    part.save_id = j.at("save_id").get<std::string>();
    part.block_bytes = j.at("block_bytes").get<std::uint64_t>();
    part.blocks = DecodeBlocks(j.at("blocks"));
    for (const auto& p : j.at("pieces")) {
      PieceRecord r;
      r.name = p.at(0).get<std::string>();
      r.file = p.at(1).get<std::string>();
      r.dtype = DTypeOrThrow(p.at(2));
      r.global_shape = p.at(3).get<std::vector<std::uint64_t>>();
      r.offsets = p.at(4).get<std::vector<std::uint64_t>>();
      r.shape = p.at(5).get<std::vector<std::uint64_t>>();
      r.begin = p.at(6).get<std::uint64_t>();
      part.pieces.push_back(std::move(r));
    }
  } catch (const std::exception& e) {
    return bad(fmt::format("missing or mistyped field: {}", e.what()));
  }
  if (part.block_bytes == 0) return bad("block_bytes is 0");
  if (part.world_size == 0 || part.rank >= part.world_size)
    return bad(fmt::format("rank {} of world size {}", part.rank, part.world_size));
  part.base = std::move(base);
  part.base.sharded_json.clear();
  return part;
}

std::string EncodeShardedLayout(const ShardedLayout& layout) {
  Json tensors = Json::array();
  for (const auto& t : layout.tensors) {
    Json pieces = Json::array();
    for (const auto& p : t.pieces) pieces.push_back(Json::array({p.rank, p.file, p.offsets, p.shape, p.begin}));
    tensors.push_back(Json::array({t.name, TensorDTypeName(t.dtype), t.shape, std::move(pieces)}));
  }
  Json j = {{"world_size", layout.world_size},
            {"save_id", layout.save_id},
            {"block_bytes", layout.block_bytes},
            {"blocks", EncodeBlocks(layout.blocks)},
            {"tensors", std::move(tensors)}};
  return j.dump();
}

Result<ShardedLayout> DecodeShardedLayout(std::string_view text, std::string_view path) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("checkpoint manifest '{}': {}", path, what));
  };
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("its \"sharded\" member is not a JSON object");
  ShardedLayout layout;
  try {
    layout.world_size = j.at("world_size").get<std::uint32_t>();
    layout.save_id = j.at("save_id").get<std::string>();
    layout.block_bytes = j.at("block_bytes").get<std::uint64_t>();
    layout.blocks = DecodeBlocks(j.at("blocks"));
    for (const auto& t : j.at("tensors")) {
      ShardedTensorInfo info;
      info.name = t.at(0).get<std::string>();
      info.dtype = DTypeOrThrow(t.at(1));
      info.shape = t.at(2).get<std::vector<std::uint64_t>>();
      for (const auto& p : t.at(3)) {
        ShardPiece piece;
        piece.rank = p.at(0).get<std::uint32_t>();
        piece.file = p.at(1).get<std::string>();
        piece.offsets = p.at(2).get<std::vector<std::uint64_t>>();
        piece.shape = p.at(3).get<std::vector<std::uint64_t>>();
        piece.begin = p.at(4).get<std::uint64_t>();
        info.pieces.push_back(std::move(piece));
      }
      layout.tensors.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    return bad(fmt::format("missing or mistyped field in \"sharded\": {}", e.what()));
  }
  if (layout.block_bytes == 0 || layout.world_size == 0) return bad("block_bytes or world_size is 0");
  for (std::size_t i = 1; i < layout.tensors.size(); ++i)
    if (!(layout.tensors[i - 1].name < layout.tensors[i].name))
      return bad(fmt::format("tensors are not sorted and unique at '{}'", layout.tensors[i].name));
  for (const auto& t : layout.tensors) {
    for (const auto& p : t.pieces) {
      if (!PlainFileName(p.file)) return bad(fmt::format("tensor '{}': file '{}' is not a plain name", t.name, p.file));
      if (p.rank >= layout.world_size)
        return bad(fmt::format("tensor '{}': rank {} of world size {}", t.name, p.rank, layout.world_size));
    }
    STOKER_RETURN_IF_ERROR(CheckTiling(t, path));
  }
  return layout;
}

Status CheckTiling(const ShardedTensorInfo& t, std::string_view where) {
  auto bad = [&](std::string what) {
    return Status::Corruption(
        fmt::format("{}: tensor '{}' of shape [{}]: {}", where, t.name, fmt::join(t.shape, ","), what));
  };
  if (t.pieces.empty()) return bad("no rank wrote any piece of it");
  // The sum of the volumes, each piece inside, no two overlapping: then the
  // pieces cover the tensor exactly. Overlaps are looked for by a sweep
  // along dimension 0, so a tensor cut into many slices is checked in
  // O(p log p).
  std::uint64_t covered = 0;
  for (const auto& p : t.pieces) {
    if (p.offsets.size() != t.shape.size() || p.shape.size() != t.shape.size())
      return bad(fmt::format("rank {}'s piece has rank {}, not {}", p.rank, p.shape.size(), t.shape.size()));
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if (p.offsets[d] > t.shape[d] || p.shape[d] > t.shape[d] - p.offsets[d])
        return bad(fmt::format("rank {}'s piece at [{}] of shape [{}] lies outside it", p.rank,
                               fmt::join(p.offsets, ","), fmt::join(p.shape, ",")));
    covered += Volume(p.shape);
  }
  if (t.shape.empty()) {
    if (t.pieces.size() != 1) return bad(fmt::format("{} pieces of a scalar", t.pieces.size()));
    return Status::Ok();
  }
  std::vector<const ShardPiece*> order;
  for (const auto& p : t.pieces)
    if (Volume(p.shape) > 0) order.push_back(&p);
  std::sort(order.begin(), order.end(),
            [](const ShardPiece* a, const ShardPiece* b) { return a->offsets[0] < b->offsets[0]; });
  std::vector<const ShardPiece*> active;
  for (const ShardPiece* p : order) {
    std::erase_if(active, [&](const ShardPiece* q) { return q->offsets[0] + q->shape[0] <= p->offsets[0]; });
    for (const ShardPiece* q : active)
      if (Overlap(*p, *q))
        return bad(fmt::format("rank {}'s piece at [{}] and rank {}'s at [{}] overlap", q->rank,
                               fmt::join(q->offsets, ","), p->rank, fmt::join(p->offsets, ",")));
    active.push_back(p);
  }
  if (covered != Volume(t.shape))
    return bad(
        fmt::format("its pieces cover {} of its {} elements (a rank's pieces are missing?)", covered, Volume(t.shape)));
  return Status::Ok();
}

Result<Manifest> MergeRankParts(const std::vector<RankPart>& parts, const std::vector<ManifestFile>& part_files,
                                std::string_view where) {
  if (parts.empty()) return Status::InvalidArgument("no rank parts to merge");
  const RankPart& first = parts.front();
  Manifest out;
  out.step = first.base.step;
  out.created_unix_seconds = first.base.created_unix_seconds;
  out.extras = first.base.extras;
  ShardedLayout layout;
  layout.world_size = first.world_size;
  layout.save_id = first.save_id;
  layout.block_bytes = first.block_bytes;
  std::map<std::string, ShardedTensorInfo> tensors;
  std::map<std::string, std::uint32_t> file_owner;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    const RankPart& part = parts[r];
    const std::string name = RankPartName(static_cast<std::uint32_t>(r));
    if (part.rank != r || part.world_size != first.world_size || part.save_id != first.save_id ||
        part.base.step != first.base.step || part.block_bytes != first.block_bytes)
      return Status::Corruption(fmt::format(
          "{}: {} says rank {} of {}, step {}, save '{}'; rank 0 says rank 0 of {}, step {}, save '{}' (ranks saving "
          "different steps?)",
          where, name, part.rank, part.world_size, part.base.step, part.save_id, first.world_size, first.base.step,
          first.save_id));
    for (const auto& f : part.base.files) {
      if (!PlainFileName(f.name) || !f.name.starts_with(RankStem(part.rank)))
        return Status::Corruption(fmt::format("{}: rank {} lists file '{}', not one of its own", where, r, f.name));
      if (!file_owner.emplace(f.name, part.rank).second)
        return Status::Corruption(fmt::format("{}: file '{}' is listed by two ranks", where, f.name));
      out.files.push_back(f);
      const auto blocks = part.blocks.find(f.name);
      if (blocks == part.blocks.end() || blocks->second.size() != (f.bytes + part.block_bytes - 1) / part.block_bytes)
        return Status::Corruption(fmt::format("{}: rank {} gives {} block checksums for '{}' ({} bytes)", where, r,
                                              blocks == part.blocks.end() ? 0 : blocks->second.size(), f.name,
                                              f.bytes));
      layout.blocks.emplace(f.name, blocks->second);
    }
    for (const auto& p : part.pieces) {
      if (!file_owner.contains(p.file) || file_owner[p.file] != part.rank)
        return Status::Corruption(
            fmt::format("{}: rank {}'s piece of '{}' is in '{}', not one of its files", where, r, p.name, p.file));
      auto [it, added] = tensors.try_emplace(p.name);
      ShardedTensorInfo& t = it->second;
      if (added) {
        t.name = p.name;
        t.dtype = p.dtype;
        t.shape = p.global_shape;
      } else if (t.dtype != p.dtype || t.shape != p.global_shape) {
        return Status::Corruption(
            fmt::format("{}: ranks disagree on tensor '{}': rank {} has {} [{}], rank {} has {} [{}]", where, p.name,
                        t.pieces.front().rank, TensorDTypeName(t.dtype), fmt::join(t.shape, ","), r,
                        TensorDTypeName(p.dtype), fmt::join(p.global_shape, ",")));
      }
      t.pieces.push_back({part.rank, p.file, p.offsets, p.shape, p.begin});
    }
  }
  for (const auto& f : part_files) out.files.push_back(f);
  for (auto& [name, t] : tensors) {
    STOKER_RETURN_IF_ERROR(CheckTiling(t, where));
    auto bytes = safetensors::TensorBytes(t.dtype, t.shape);
    if (!bytes.ok()) return bytes.error().WithContext(fmt::format("{}: tensor '{}'", where, name));
    out.tensor_bytes += *bytes;
    layout.tensors.push_back(std::move(t));
  }
  out.tensor_count = layout.tensors.size();
  out.sharded_json = EncodeShardedLayout(layout);
  return out;
}

}  // namespace stoker::checkpoint
