// The C++ safetensors reader and writer: round trips, aliasing, and a corpus of malformed files,
// each with the exact problem the reader must name.
#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/checkpoint/safetensors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "error_message.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using test_support::error_of;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "tb_" + std::to_string(::getpid()) + "_" + name;
}

// A file made of a raw header (padded to 8 bytes) and `data` bytes.
std::string write_raw(const std::string& name, std::string header, size_t data_bytes, int64_t declared_length = -1) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = declared_length >= 0 ? uint64_t(declared_length) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return path;
}

at::Tensor random_bits(at::ScalarType dtype, std::vector<int64_t> shape) {
  const int64_t bytes = c10::multiply_integers(shape) * int64_t(c10::elementSize(dtype));
  at::Tensor raw = at::randint(0, 256, {bytes}, at::kByte);
  if (dtype == at::kBool) raw = raw.remainder(2);
  return raw.view(dtype).view(shape);
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         at::equal(a.reshape(-1).view(at::kByte), b.reshape(-1).view(at::kByte));
}

TEST(Safetensors, EveryDtypeRoundTripsBitExactly) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto dtype : {at::kBool, at::kByte, at::kChar, at::kShort, at::kUInt16, at::kInt, at::kUInt32, at::kLong,
                           at::kUInt64, at::kHalf, at::kBFloat16, at::kFloat, at::kDouble, at::kFloat8_e4m3fn,
                           at::kFloat8_e5m2, at::kComplexFloat}) {
    tensors.emplace_back(safetensors_dtype_name(dtype), random_bits(dtype, {3, 5}));
  }
  tensors.emplace_back("scalar", at::scalar_tensor(2.5));
  tensors.emplace_back("empty", at::empty({0, 4}));
  tensors.emplace_back("strided", at::arange(12.0).view({3, 4}).t());  // non-contiguous input
  const std::string path = temp_path("all.safetensors");
  save(path, tensors, {{"format", "pt"}, {"note", "round trip"}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.tensors().size(), tensors.size());
  EXPECT_EQ(file.metadata().at("note"), "round trip");
  for (const auto& [name, original] : tensors) {
    EXPECT_TRUE(bit_equal(file.load(name), original.contiguous())) << name;
    EXPECT_TRUE(file.aliases(name) || original.numel() == 0) << name << " should alias: the writer aligns data";
  }
  EXPECT_EQ(file.load("scalar").dim(), 0);
}

TEST(Safetensors, AliasesTheMappingAndWritesNeverReachTheFile) {
  const std::string path = temp_path("alias.safetensors");
  save(path, {{"x", at::ones({4})}});
  {
    const auto file = SafetensorsFile::open(path);
    at::Tensor x = file.load("x");
    x.fill_(7);  // copy-on-write mapping: the file keeps its bytes
    EXPECT_EQ(file.load("x").sum().item<float>(), 28.0f) << "aliases share the mapping";
  }
  EXPECT_EQ(SafetensorsFile::open(path).load("x").sum().item<float>(), 4.0f);
  at::Tensor outlives;
  {
    outlives = SafetensorsFile::open(path).load("x");  // keeps the mapping alive past the file object
  }
  EXPECT_EQ(outlives.sum().item<float>(), 4.0f);
}

TEST(Safetensors, MisalignedDataIsCopiedNotAliased) {
  // A hand-made file whose F32 tensor starts 2 bytes into the data section.
  const std::string header = R"({"pad":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"x":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  const std::string path = write_raw("misaligned.safetensors", header + std::string((8 - header.size() % 8) % 8, ' '), 6);
  const auto file = SafetensorsFile::open(path);
  EXPECT_FALSE(file.aliases("x"));
  EXPECT_EQ(file.load("x").item<float>(), 0.0f);
}

// A conjugate or negative view is a bit over unchanged bytes; the file must hold its values.
TEST(Safetensors, ConjugateAndNegativeViewsAreSavedAsTheirValues) {
  const std::string path = temp_path("conj.safetensors");
  const at::Tensor z = at::randn({3}, at::kComplexFloat);
  const at::Tensor conjugate = z.conj();  // contiguous, with the conjugate bit
  const at::Tensor negative = at::imag(z.clone().conj());  // a negative view (of other storage)
  ASSERT_TRUE(conjugate.is_conj() && conjugate.is_contiguous());
  ASSERT_TRUE(negative.is_neg());
  save(path, {{"conjugate", conjugate}, {"negative", negative}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(file.load("conjugate"), conjugate.resolve_conj()));
  EXPECT_TRUE(at::equal(file.load("negative"), negative.resolve_neg()));
}

// The header is JSON text: a name that is not UTF-8 is refused naming it, before any file exists.
TEST(Safetensors, NamesAndMetadataThatAreNotUtf8AreRefused) {
  const std::string path = temp_path("utf8.safetensors");
  std::string message = error_of([&] { save(path, {{"caf\xe9", at::ones({1})}}); });
  EXPECT_NE(message.find("tensor name \"caf\xef\xbf\xbd\" is not valid UTF-8"), std::string::npos) << message;
  message = error_of([&] { save(path, {{"x", at::ones({1})}}, {{"note", "\xff"}}); });
  EXPECT_NE(message.find("metadata value"), std::string::npos) << message;
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "a refused save must write nothing";
}

TEST(Safetensors, SharedStorageIsRefusedAndTheExistingFileSurvives) {
  const std::string path = temp_path("shared.safetensors");
  save(path, {{"old", at::ones({2})}});
  const at::Tensor weight = at::randn({4, 4});
  const std::string message = error_of([&] { save(path, {{"embed", weight}, {"head", weight.view({16})}}); });
  EXPECT_NE(message.find("'embed' and 'head' share storage"), std::string::npos) << message;
  EXPECT_TRUE(SafetensorsFile::open(path).contains("old")) << "a failed save must not damage the previous file";
  // No temporary files are left behind.
  DIR* dir = opendir(::testing::TempDir().c_str());
  for (dirent* entry; (entry = readdir(dir)) != nullptr;) {
    EXPECT_EQ(std::string(entry->d_name).find("shared.safetensors.tmp-"), std::string::npos) << entry->d_name;
  }
  closedir(dir);
}

// Views of one storage that share no bytes (the parts of a fused weight) are saved, each on its
// own, as the safetensors package saves them; overlapping ones are still refused.
TEST(Safetensors, ViewsSharingNoBytesAreSavedAndOverlappingOnesRefused) {
  const std::string path = temp_path("fused.safetensors");
  const at::Tensor fused = at::randn({6, 4});
  save(path, {{"q", fused.slice(0, 0, 2)}, {"k", fused.slice(0, 2, 4)}, {"v", fused.slice(0, 4, 6)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(at::equal(file.load("k"), fused.slice(0, 2, 4)));
  EXPECT_TRUE(at::equal(file.load("v"), fused.slice(0, 4, 6)));
  const std::string message = error_of([&] { save(path, {{"a", fused.slice(0, 0, 3)}, {"b", fused.slice(0, 2, 6)}}); });
  EXPECT_NE(message.find("tensors 'a' and 'b' share storage"), std::string::npos) << message;
  // Columns interleave in memory: their spans overlap though no element is shared, and are refused.
  EXPECT_NE(error_of([&] { save(path, {{"c0", fused.select(1, 0)}, {"c1", fused.select(1, 1)}}); }).find("share storage"),
            std::string::npos);
}

// model.safetensors beside model.safetensors.index.json: transformers reads the single file, an
// index-first reader the shards; neither is guessed, and save does not make such a directory.
TEST(Checkpoint, ADirectoryHoldingBothASingleFileAndAnIndexIsRefused) {
  const std::string directory = temp_path("both");
  save_sharded(directory, {{"a", at::randn({16})}, {"b", at::randn({16})}}, 64);
  ASSERT_TRUE(Checkpoint::open(directory).sharded());
  std::string message = error_of([&] { save(directory + "/model.safetensors", {{"a", at::zeros({16})}}); });
  EXPECT_NE(message.find("model.safetensors.index.json beside it names a sharded checkpoint"), std::string::npos)
      << message;
  EXPECT_NE(::access((directory + "/model.safetensors").c_str(), F_OK), 0) << "a refused save must write nothing";
  std::ofstream(directory + "/model.safetensors") << "stale";
  message = error_of([&] { Checkpoint::open(directory); });
  EXPECT_NE(message.find("directory holds both model.safetensors and model.safetensors.index.json"), std::string::npos)
      << message;
  EXPECT_TRUE(Checkpoint::open(directory + "/model.safetensors.index.json").sharded()) << "a named file still opens";
  // Saved under the index's own name, a single file replaced the index: the shards no longer opened.
  message = error_of([&] { save(directory + "/model.safetensors.index.json", {{"a", at::zeros({16})}}); });
  EXPECT_NE(message.find("names a JSON file; a single safetensors file needs another name"), std::string::npos)
      << message;
  EXPECT_TRUE(Checkpoint::open(directory + "/model.safetensors.index.json").sharded()) << "the index is intact";
}

// The prefix names files inside the directory: "../model" overwrote the checkpoint beside it.
TEST(Checkpoint, AShardPrefixThatIsNoFileNameStemIsRefused) {
  const std::string outer = temp_path("prefix");
  save_sharded(outer, {{"precious", at::ones({4})}}, 1 << 20);
  const std::string inner = outer + "/sub";
  for (const std::string prefix : {"../model", "", ".", "..", "a/b"}) {
    const std::string message = error_of([&] { save_sharded(inner, {{"w", at::zeros({4})}}, 1 << 20, {}, prefix); });
    EXPECT_NE(message.find("invalid file prefix '" + prefix + "'"), std::string::npos) << message;
  }
  EXPECT_EQ(Checkpoint::open(outer).names(), std::vector<std::string>{"precious"});
}

// A saved checkpoint gets the permissions any new file gets (0666 less the umask), as
// torch.save's files do; replacing a file keeps that file's permissions. mkstemp alone gave 0600.
TEST(Safetensors, SavedFilesGetTheUsualPermissions) {
  const std::string path = temp_path("mode.safetensors");
  ::unlink(path.c_str());
  const mode_t previous = ::umask(022);
  save(path, {{"w", at::ones({2})}});
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);

  ::umask(027);
  ::unlink(path.c_str());
  save(path, {{"w", at::ones({2})}});
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);

  ASSERT_EQ(::chmod(path.c_str(), 0604), 0);  // replacing keeps the replaced file's permissions
  save(path, {{"w", at::zeros({2})}});
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0604u);
  ::umask(previous);
}

// Shard sizes given as text: a number too large for 64 bits, or one that overflows with its unit,
// is a clear error naming the text (std::stoull's out_of_range escaped as an unnamed exception).
// save() checks one file; a sharded write must check the whole checkpoint, or a name given twice
// landed in two shards (the index keeping one, Checkpoint::open refusing the result) and tied
// tensors were stored twice.
TEST(Checkpoint, ANameOrAStorageTwiceAcrossShardsIsRefusedAndNothingIsWritten) {
  const std::string directory = temp_path("sharded_twice");
  const at::Tensor weight = at::randn({16});
  std::string message = error_of([&] { save_sharded(directory, {{"a.b", weight}, {"a.b", at::randn({16})}}, 64); });
  EXPECT_NE(message.find("tensor name 'a.b' is given twice"), std::string::npos) << message;
  message = error_of([&] { save_sharded(directory, {{"embed", weight}, {"head", weight.view({4, 4})}}, 64); });
  EXPECT_NE(message.find("tensors 'embed' and 'head' share storage"), std::string::npos) << message;
  // Refused before the directory is created: a refused save leaves no empty directory behind.
  struct stat info {};
  EXPECT_NE(::stat(directory.c_str(), &info), 0) << "a refused write created " << directory;
}

TEST(Checkpoint, TheFilesOfADirectoryCheckpointAreToldFromItsShards) {
  using checkpoint::is_checkpoint_file;
  using checkpoint::is_checkpoint_shard_file;
  for (const char* whole : {"model.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(is_checkpoint_file(whole)) << whole;
    EXPECT_FALSE(is_checkpoint_shard_file(whole)) << whole;
  }
  EXPECT_TRUE(is_checkpoint_shard_file("model-00002-of-00003.safetensors"));
  EXPECT_TRUE(is_checkpoint_file("model-00002-of-00003.safetensors"));
  EXPECT_TRUE(is_checkpoint_shard_file("adapter-00001-of-00001.safetensors", "adapter"));
  for (const char* other : {"model-2-of-3.safetensors", "model-00002-of-00003.bin", "other-00001-of-00002.safetensors",
                            "model-0000a-of-00003.safetensors", "model.bin"}) {
    EXPECT_FALSE(is_checkpoint_file(other)) << other;
    EXPECT_FALSE(is_checkpoint_shard_file(other)) << other;
  }
}

TEST(Checkpoint, ShardSizesAreParsedStrictly) {
  EXPECT_EQ(parse_size("500MB"), 500'000'000u);
  EXPECT_EQ(parse_size("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(error_of([] { parse_size("99999999999999999999999MB"); }),
            "invalid size '99999999999999999999999MB': more than 2^64 bytes");  // not "from 0 to": 0 is refused
  const std::string overflow = error_of([] { parse_size("17179869184GiB"); });
  EXPECT_NE(overflow.find("invalid size '17179869184GiB'"), std::string::npos) << overflow;
  EXPECT_NE(error_of([] { parse_size("12XB"); }).find("unknown unit 'XB'"), std::string::npos);
  EXPECT_EQ(parse_size("2kB"), 2000u);  // the SI spelling, as transformers reads it
  // transformers reads a lowercase b as bits (an eighth): refused rather than read either way.
  EXPECT_EQ(error_of([] { parse_size("5Gb"); }),
            "invalid size '5Gb': unit 'Gb' ends in a lowercase b, which reads as bits; write B for bytes (e.g. 5GB)");
  // The hint is a unit this parser reads: "10mb" suggested "10mB", itself refused.
  EXPECT_NE(error_of([] { parse_size("10mb"); }).find("(e.g. 10MB)"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size("3mib"); }).find("(e.g. 3MiB)"), std::string::npos);
  EXPECT_NE(error_of([] { parse_size("3xb"); }).find("unknown unit 'xb'"), std::string::npos);
}

std::string deeply_nested(int levels) {
  std::string text;
  for (int i = 0; i < levels; ++i) text += "{\"a\":";
  return text + "1" + std::string(levels, '}');
}

struct Malformed {
  const char* name;
  std::string header;
  size_t data_bytes;
  const char* expected;
};

// What the safetensors package reads, as it reads it: a null __metadata__ is no metadata.
TEST(Safetensors, ANullMetadataIsNoMetadata) {
  const std::string path =
      write_raw("null_metadata.safetensors", R"({"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_TRUE(at::equal(file.load("a"), at::zeros({2}, at::kByte)));
}

TEST(Safetensors, MalformedFilesAreRejectedNamingTheProblem) {
  const std::vector<Malformed> corpus = {
      {"not_json", "{nope", 0, "header is not valid JSON"},
      {"not_object", "[1, 2]   ", 0, "header must be a JSON object"},
      {"duplicate", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2,
       "tensor 'a': appears twice"},
      {"unknown_dtype", R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,2]}})", 2, "tensor 'a': unsupported dtype 'F12'"},
      {"size_mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "tensor 'a': shape [2] of F32 needs 8 bytes"},
      {"hole", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2, "tensor 'a': leaves a hole"},
      {"overlap", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3,
       "tensor 'b': overlaps"},
      {"trailing", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 5, "holds 5 bytes but the tensors cover 1"},
      {"truncated", R"({"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", 3, "(file truncated?)"},
      {"overflow", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       "has more elements than 64 bits can count"},
      {"empty_but_unstrided", R"({"a":{"dtype":"U8","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})", 0,
       "tensor 'a': shape [0,4611686018427387904,4] has dimensions whose product 64 bits cannot count"},
      {"negative", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "shape entries must be non-negative"},
      {"reversed", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 2, "end before they begin"},
      {"metadata", R"({"__metadata__":{"k":3}})", 0, "__metadata__ value for 'k' must be a string"},
      {"deep", deeply_nested(100), 0, "nests deeper than 64"},
      {"field_twice", R"({"a":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]}})", 1,
       "tensor 'a': its entry gives \"shape\" twice"},
      {"metadata_key_twice", R"({"__metadata__":{"k":"1","k":"2"}})", 0, "__metadata__ gives key 'k' twice"},
      // The JSON parser takes a NUL for the end of its input: what follows one was ignored.
      {"nul_then_junk", std::string(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})") + '\0' + "junk", 1,
       "header holds a NUL byte at byte 53"},
      {"odd_f4", R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2,
       "tensor 'a': shape [3] of F4 must have a last dimension divisible by 2"},
      {"scalar_f4", R"({"a":{"dtype":"F4","shape":[],"data_offsets":[0,1]}})", 1, "must have a last dimension"},
  };
  for (const auto& m : corpus) {
    const std::string path = write_raw(std::string(m.name) + ".safetensors", m.header, m.data_bytes);
    const std::string message = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_NE(message.find(m.expected), std::string::npos) << m.name << ": " << message;
    EXPECT_NE(message.find(path), std::string::npos) << m.name << " must name the file: " << message;
  }
}

// What the safetensors package reads, as it reads it: JSON may begin with whitespace.
TEST(Safetensors, AHeaderMayBeginWithWhitespace) {
  const std::string path = write_raw("leading_space.safetensors", " \n{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
  EXPECT_TRUE(at::equal(SafetensorsFile::open(path).load("a"), at::zeros({2}, at::kByte)));
}

// F4 is torch's float4_e2m1fn_x2, two values a byte: the file's shape counts values, so its last
// dimension is twice torch's (as the safetensors package writes and reads it).
TEST(Safetensors, F4HoldsTwoValuesAByteAlongTheLastDimension) {
  const std::string path = temp_path("f4.safetensors");
  const at::Tensor packed = at::arange(12, at::kByte).view({4, 3}).view(at::ScalarType::Float4_e2m1fn_x2);
  save(path, {{"w", packed}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.record("w").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(file.record("w").end - file.record("w").begin, 12u);
  EXPECT_TRUE(bit_equal(file.load("w"), packed));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find(R"("dtype":"F4","shape":[4,6])"), std::string::npos) << bytes.substr(8, 80);
  const std::string message = error_of([&] { save(temp_path("f4_scalar.safetensors"), {{"s", packed[0][0]}}); });
  EXPECT_NE(message.find("tensor 's' is a 0-dim Float4_e2m1fn_x2"), std::string::npos) << message;
}

TEST(Safetensors, AGitLfsPointerIsNamedAsOne) {
  const std::string path = temp_path("lfs.safetensors");
  std::ofstream(path, std::ios::binary) << "version https://git-lfs.github.com/spec/v1\n"
                                           "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
                                           "size 12345\n";
  const std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(message.find("is a git-lfs pointer file"), std::string::npos) << message;
}

TEST(Safetensors, BadLengthsAndTinyFiles) {
  const std::string tiny = temp_path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abcde";
  EXPECT_NE(error_of([&] { SafetensorsFile::open(tiny); }).find("5 bytes, too small"), std::string::npos);
  const std::string huge = write_raw("huge.safetensors", "{}      ", 0, int64_t(kMaxHeaderBytes) + 1);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(huge); }).find("exceeds the format's limit"), std::string::npos);
  const std::string past = write_raw("past.safetensors", "{}      ", 0, 4096);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(past); }).find("runs past the end"), std::string::npos);
  EXPECT_NE(error_of([] { SafetensorsFile::open("/nonexistent/x.safetensors"); }).find("cannot open"), std::string::npos);
  const auto file = SafetensorsFile::open(write_raw("empty_ok.safetensors", "{}      ", 0));
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_NE(error_of([&] { file.record("missing"); }).find("no tensor named 'missing'"), std::string::npos);
}

}  // namespace
}  // namespace torchbridge::checkpoint
