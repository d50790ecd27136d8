#include "pagoda/format/gguf.h"

#include <bit>
#include <cstring>
#include <limits>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;            // real files nest at most once (arrays of arrays)
constexpr uint32_t kMaxDims = 4;             // ggml's GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;

std::string_view value_type_name(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                                "i32", "f32", "bool", "string", "array",
                                                "u64", "i64", "f64"};
  return kNames[uint32_t(type)];
}

// Smallest encoding of one value of a type: bounds an array's claimed length by the bytes left
// before anything is allocated for it.
uint64_t min_encoded_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16: return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32: return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64: return 8;
    case GgufValueType::kString: return 8;  // its length
    case GgufValueType::kArray: return 12;  // element type and length
  }
  return 1;
}

// A cursor over the file's bytes. Every read first checks that the bytes remain; every error
// names the file, the problem and the offset where the offending field starts.
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, const std::string& origin)
      : bytes_(bytes), origin_(origin) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return bytes_.size(); }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename... Args>
  [[noreturn]] void corrupt(fmt::format_string<Args...> format, Args&&... args) const {
    fail(ErrorKind::kCorrupt, "corrupt GGUF file '{}': {}", origin_,
         fmt::format(format, std::forward<Args>(args)...));
  }

  [[noreturn]] void past_end(std::string_view what, uint64_t at) const {
    corrupt("{} at offset {} runs past end of file (size {})", what, at, size());
  }

  template <typename T>
  T read(std::string_view what) {
    if (sizeof(T) > remaining()) past_end(what, pos_);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));  // GGUF is little-endian, as is x86/arm
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    const uint64_t length = read<uint64_t>(what);
    if (length > remaining()) past_end(fmt::format("{} length {}", what, length), at);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return s;
  }

  GgufValueType read_value_type(std::string_view what) {
    const uint64_t at = pos_;
    const uint32_t type = read<uint32_t>(what);
    if (type > uint32_t(GgufValueType::kF64)) corrupt("unknown {} {} at offset {}", what, type, at);
    return GgufValueType(type);
  }

  GgufValue read_value(GgufValueType type, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufValueType::kU8: v.value = uint64_t(read<uint8_t>("u8 value")); break;
      case GgufValueType::kI8: v.value = int64_t(read<int8_t>("i8 value")); break;
      case GgufValueType::kU16: v.value = uint64_t(read<uint16_t>("u16 value")); break;
      case GgufValueType::kI16: v.value = int64_t(read<int16_t>("i16 value")); break;
      case GgufValueType::kU32: v.value = uint64_t(read<uint32_t>("u32 value")); break;
      case GgufValueType::kI32: v.value = int64_t(read<int32_t>("i32 value")); break;
      case GgufValueType::kU64: v.value = read<uint64_t>("u64 value"); break;
      case GgufValueType::kI64: v.value = read<int64_t>("i64 value"); break;
      case GgufValueType::kF32: v.value = double(read<float>("f32 value")); break;
      case GgufValueType::kF64: v.value = read<double>("f64 value"); break;
      case GgufValueType::kBool: {
        const uint64_t at = pos_;
        const uint8_t b = read<uint8_t>("bool value");
        if (b > 1) corrupt("bool value {} at offset {} is neither 0 nor 1", b, at);
        v.value = b == 1;
        break;
      }
      case GgufValueType::kString: v.value = read_string("string"); break;
      case GgufValueType::kArray: v.value = read_array(depth + 1); break;
    }
    return v;
  }

 private:
  std::vector<GgufValue> read_array(int depth) {
    if (depth > kMaxArrayDepth) {
      corrupt("arrays nested deeper than {} at offset {}", kMaxArrayDepth, pos_);
    }
    const GgufValueType element_type = read_value_type("array element type");
    const uint64_t at = pos_;
    const uint64_t count = read<uint64_t>("array length");
    if (count > remaining() / min_encoded_bytes(element_type)) {
      past_end(fmt::format("array of {} {} values", count, value_type_name(element_type)), at);
    }
    std::vector<GgufValue> elements;
    elements.reserve(count);
    for (uint64_t i = 0; i < count; ++i) elements.push_back(read_value(element_type, depth));
    return elements;
  }

  std::span<const uint8_t> bytes_;
  const std::string& origin_;
  uint64_t pos_ = 0;
};

// Rounds up to a multiple of a power of two; false on overflow.
bool align_up(uint64_t x, uint64_t alignment, uint64_t& out) {
  if (__builtin_add_overflow(x, alignment - 1, &out)) return false;
  out &= ~(alignment - 1);
  return true;
}

[[noreturn]] void wrong_type(const GgufValue& v, std::string_view wanted) {
  fail(ErrorKind::kCorrupt, "GGUF value of type {} used as {}", value_type_name(v.type), wanted);
}

// Runs a typed accessor on a metadata value, naming the key and file when the type is wrong.
template <typename Get>
auto get_typed(const GgufFile& file, std::string_view key, Get&& get) {
  const GgufValue& v = file.at(key);
  try {
    return get(v);
  } catch (const Error& e) {
    fail(e.kind(), "metadata key '{}' in {}: {}", key, file.origin(), e.what());
  }
}

}  // namespace

int64_t GgufValue::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > uint64_t(std::numeric_limits<int64_t>::max())) {
      fail(ErrorKind::kCorrupt, "GGUF integer {} does not fit in int64", *u);
    }
    return int64_t(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  wrong_type(*this, "an integer");
}

double GgufValue::as_float() const {
  if (const auto* u = std::get_if<uint64_t>(&value)) return double(*u);
  if (const auto* i = std::get_if<int64_t>(&value)) return double(*i);
  if (const auto* d = std::get_if<double>(&value)) return *d;
  wrong_type(*this, "a number");
}

bool GgufValue::as_bool() const {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  wrong_type(*this, "a bool");
}

const std::string& GgufValue::as_string() const {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  wrong_type(*this, "a string");
}

const std::vector<GgufValue>& GgufValue::as_array() const {
  if (const auto* a = std::get_if<std::vector<GgufValue>>(&value)) return *a;
  wrong_type(*this, "an array");
}

GgufValueType GgufValue::array_type() const {
  const auto& elements = as_array();
  return elements.empty() ? GgufValueType::kU8 : elements.front().type;
}

GgufFile GgufFile::open(const std::string& path) { return GgufFile(FileBytes::map(path)); }

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string_view origin) {
  return GgufFile(FileBytes::borrow(bytes, origin));
}

GgufFile::GgufFile(FileBytes source) : source_(std::move(source)) { parse_bytes(source_.bytes); }

void GgufFile::parse_bytes(std::span<const uint8_t> bytes) {
  Reader r(bytes, source_.origin);

  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != kGgufMagic) {
    r.corrupt("bad magic 0x{:08x} at offset 0 (expected \"GGUF\")", __builtin_bswap32(magic));
  }
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file shows its small version number in the high bytes.
    if ((version_ & 0xffff) == 0 &&
        (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3)) {
      fail(ErrorKind::kUnsupported,
           "GGUF file '{}' is big-endian; pagoda reads little-endian "
           "GGUF only",
           source_.origin);
    }
    fail(ErrorKind::kUnsupported, "GGUF file '{}' has version {}; pagoda reads versions 2 and 3",
         source_.origin, version_);
  }
  const uint64_t tensor_count = r.read<uint64_t>("tensor count");
  const uint64_t kv_count = r.read<uint64_t>("metadata count");

  // Counts are not trusted for allocation: each entry is read (and bounds-checked) in turn, and
  // every entry consumes at least 12 bytes, so a huge claimed count ends at the end of the file.
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t at = r.pos();
    std::string key = r.read_string("metadata key");
    const GgufValueType type = r.read_value_type("metadata value type");
    GgufValue value = r.read_value(type, 0);
    if (!metadata_index_.emplace(key, metadata_.size()).second) {
      r.corrupt("duplicate metadata key '{}' at offset {}", key, at);
    }
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = find("general.alignment")) {
    uint64_t alignment = 0;  // stays 0 (rejected) for a non-integer or negative value
    if (const auto* u = std::get_if<uint64_t>(&a->value)) alignment = *u;
    if (const auto* i = std::get_if<int64_t>(&a->value)) alignment = *i > 0 ? uint64_t(*i) : 0;
    if (!std::has_single_bit(alignment)) {
      r.corrupt("general.alignment must be a nonzero power of two");
    }
    alignment_ = alignment;
  }

  for (uint64_t i = 0; i < tensor_count; ++i) {
    const uint64_t at = r.pos();
    GgufTensorInfo t;
    t.name = r.read_string("tensor name");
    const uint64_t dims_at = r.pos();
    const uint32_t n_dims = r.read<uint32_t>("tensor dimension count");
    if (n_dims > kMaxDims) {
      r.corrupt("tensor '{}' has {} dimensions at offset {} (at most {})", t.name, n_dims, dims_at,
                kMaxDims);
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.read<uint64_t>("tensor dimension");
      if (!multiply_dim(numel, dim)) {
        r.corrupt("tensor '{}' dimensions at offset {} overflow 64 bits", t.name, dims_at);
      }
      t.dims.push_back(int64_t(dim));
    }
    const uint64_t type_at = r.pos();
    const uint32_t type = r.read<uint32_t>("tensor type");
    const GgmlTypeTraits traits = ggml_type_traits(type);
    if (traits.block_size == 0) {
      r.corrupt("tensor '{}' has unknown type {} at offset {}", t.name, type, type_at);
    }
    t.type = GgmlType(type);
    const uint64_t row = t.dims.empty() ? 1 : uint64_t(t.dims[0]);
    if (row % uint64_t(traits.block_size) != 0) {
      r.corrupt(
          "tensor '{}' at offset {} has rows of {} elements, not a multiple of the {} block "
          "size {}",
          t.name, at, row, traits.name, traits.block_size);
    }
    // numel / block_size blocks: exact, since the row length is a multiple of the block size.
    if (__builtin_mul_overflow(numel / uint64_t(traits.block_size), uint64_t(traits.block_bytes),
                               &t.nbytes)) {
      r.corrupt("tensor '{}' at offset {} has a byte size that overflows 64 bits", t.name, at);
    }
    t.offset = r.read<uint64_t>("tensor offset");  // relative to the data section for now
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      r.corrupt("duplicate tensor name '{}' at offset {}", t.name, at);
    }
    tensors_.push_back(std::move(t));
  }

  uint64_t data_start;
  if (!align_up(r.pos(), alignment_, data_start)) {
    r.corrupt("data section start overflows with alignment {}", alignment_);
  }
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset % alignment_ != 0) {
      r.corrupt("tensor '{}' data offset {} is not a multiple of the alignment {}", t.name,
                t.offset, alignment_);
    }
    uint64_t begin, end;
    if (__builtin_add_overflow(data_start, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.nbytes, &end) || end > r.size()) {
      r.corrupt(
          "tensor '{}' data ({} bytes at data offset {}, file offset {}) runs past end of "
          "file (size {})",
          t.name, t.nbytes, t.offset, data_start + t.offset, r.size());
    }
    t.offset = begin;
    t.data = bytes.data() + begin;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail(ErrorKind::kNotFound, "missing metadata key '{}' in {}", key, source_.origin);
  return *v;
}

std::string GgufFile::get_string(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) { return v.as_string(); });
}

int64_t GgufFile::get_int(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) { return v.as_int(); });
}

double GgufFile::get_float(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) { return v.as_float(); });
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) {
    std::vector<std::string> out;
    out.reserve(v.as_array().size());
    for (const GgufValue& e : v.as_array()) out.push_back(e.as_string());
    return out;
  });
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) {
    std::vector<float> out;
    out.reserve(v.as_array().size());
    for (const GgufValue& e : v.as_array()) out.push_back(float(e.as_float()));
    return out;
  });
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  return get_typed(*this, key, [](const GgufValue& v) {
    std::vector<int64_t> out;
    out.reserve(v.as_array().size());
    for (const GgufValue& e : v.as_array()) out.push_back(e.as_int());
    return out;
  });
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace pagoda
