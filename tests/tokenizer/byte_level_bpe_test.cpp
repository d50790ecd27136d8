// ByteLevelBpe's word cache under hostile text: words the size of a whole request body must not
// make the cache (which outlives every request) hold their bytes, and such a word still encodes
// exactly. A byte-level vocabulary of the 256 byte tokens plus "aa" makes the expected ids plain.
#include "pagoda/tokenizer/byte_level_bpe.h"

#include <gtest/gtest.h>

#include "pagoda/tokenizer/byte_unicode.h"

namespace pagoda {
namespace {

struct ByteAlphabet {
  Vocabulary vocab;
  int32_t a = -1, aa = -1, b = -1;

  ByteAlphabet() {
    for (int byte = 0; byte < 256; ++byte) {
      vocab.pieces.push_back(bytes_to_unicode_text(std::string(1, char(byte))));
    }
    vocab.pieces.push_back("aa");
    vocab.scores.assign(vocab.pieces.size(), 0.0f);
    vocab.kinds.assign(vocab.pieces.size(), TokenKind::kNormal);
    vocab.index();
    a = *vocab.find("a");
    aa = *vocab.find("aa");
    b = *vocab.find("b");
  }
  ByteLevelBpe bpe() const {
    return ByteLevelBpe(vocab, MergeTable(vocab, {{"a", "a"}}), PreTokenizer::for_gguf_name("gpt2"), {});
  }
};

TEST(ByteLevelBpe, LongWordEncodesExactly) {
  const ByteAlphabet alphabet;
  const ByteLevelBpe bpe = alphabet.bpe();
  std::vector<int32_t> ids;
  bpe.encode(alphabet.vocab, std::string(100001, 'a') + "b", ids);
  // Merges go left to right at equal rank: 50,000 "aa", the odd "a" left over, then "b".
  ASSERT_EQ(ids.size(), 50002u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), alphabet.aa), 50000);
  EXPECT_EQ(ids[50000], alphabet.a);
  EXPECT_EQ(ids[50001], alphabet.b);
}

TEST(ByteLevelBpe, WordCacheStaysWithinItsByteBound) {
  const ByteAlphabet alphabet;
  const ByteLevelBpe bpe = alphabet.bpe();
  // 48 distinct 100 KB words: about 14 MB of words and ids if each were kept.
  for (int i = 0; i < 48; ++i) {
    std::string word(100000, 'a');
    word[size_t(i) * 2 + 1] = 'b';
    std::vector<int32_t> ids;
    bpe.encode(alphabet.vocab, word, ids);
    ASSERT_EQ(ids.size(), 1 + 1 + (100000 - 2 * size_t(i) - 2) / 2 + i) << "word " << i;
    EXPECT_LE(bpe.cached_bytes(), ByteLevelBpe::kMaxCacheBytes) << "after word " << i;
  }
  // Many short distinct words (each cached) fill the cache to its bound, then start it afresh.
  for (int i = 0; i < 150000; ++i) {
    std::string word(12, 'a');
    for (int k = 0, v = i; k < 6; ++k, v /= 26) word[size_t(k) * 2] = char('a' + v % 26);
    std::vector<int32_t> ids;
    bpe.encode(alphabet.vocab, word, ids);
  }
  EXPECT_LE(bpe.cached_bytes(), ByteLevelBpe::kMaxCacheBytes);
  // Ordinary words are still cached, and the cached answer is the computed one.
  std::vector<int32_t> first, second;
  bpe.encode(alphabet.vocab, "aaa b", first);
  EXPECT_GT(bpe.cached_bytes(), 0u);
  bpe.encode(alphabet.vocab, "aaa b", second);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first, (std::vector<int32_t>{alphabet.aa, alphabet.a, *alphabet.vocab.find(bytes_to_unicode_text(" ")),
                                         alphabet.b}));
}

}  // namespace
}  // namespace pagoda
