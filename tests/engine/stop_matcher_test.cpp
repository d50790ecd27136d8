#include "pagoda/engine/stop_matcher.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace pagoda {
namespace {

struct Streamed {
  std::vector<std::string> emitted;  // per push, then the flush
  std::string text;                  // everything emitted
  bool stopped = false;
};

Streamed feed(const std::vector<std::string>& stops, const std::vector<std::string>& deltas) {
  StopMatcher matcher(stops);
  Streamed run;
  for (const std::string& d : deltas) {
    const StopMatcher::Output out = matcher.push(d);
    EXPECT_FALSE(run.stopped && !out.text.empty()) << "text after the stop";
    run.emitted.push_back(out.text);
    run.text += out.text;
    run.stopped = run.stopped || out.stopped;
  }
  run.emitted.push_back(matcher.flush());
  run.text += run.emitted.back();
  EXPECT_EQ(matcher.stopped(), run.stopped);
  return run;
}

using Texts = std::vector<std::string>;

TEST(StopMatcher, WithoutStopStringsEverythingPassesAtOnce) {
  const Streamed run = feed({}, {"Hello", ", wor", "ld"});
  EXPECT_EQ(run.emitted, (Texts{"Hello", ", wor", "ld", ""}));
  EXPECT_FALSE(run.stopped);
}

TEST(StopMatcher, StopInsideOneDelta) {
  const Streamed run = feed({"STOP"}, {"Hello STOP world", "more"});
  EXPECT_EQ(run.emitted, (Texts{"Hello ", "", ""}));
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcher, StopSpanningDeltas) {
  const Streamed run = feed({"STOP"}, {"Hel", "lo ST", "O", "P more", "after"});
  // "ST" and then "STO" could begin the stop string, so they are held back.
  EXPECT_EQ(run.emitted, (Texts{"Hel", "lo ", "", "", "", ""}));
  EXPECT_EQ(run.text, "Hello ");
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcher, PrefixThatDoesNotMatchIsReleased) {
  // "ST" is held, then released when "STA" rules it out; the final "S" is held in its turn.
  const Streamed run = feed({"STOP"}, {"a ST", "ARS", " b"});
  EXPECT_EQ(run.emitted, (Texts{"a ", "STAR", "S b", ""}));
  EXPECT_FALSE(run.stopped);
}

TEST(StopMatcher, HeldTextIsReleasedOnlyAsFarAsItCanNoLongerMatch) {
  // "aab" in "aaab": after "aaa" the first "a" is safe, "aa" may still begin the stop string.
  const Streamed run = feed({"aab"}, {"a", "a", "a", "b"});
  EXPECT_EQ(run.emitted, (Texts{"", "", "a", "", ""}));
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcher, FlushReleasesAPendingPrefix) {
  const Streamed run = feed({"</answer>"}, {"42 </ans"});
  EXPECT_EQ(run.emitted, (Texts{"42 ", "</ans"}));
  EXPECT_FALSE(run.stopped);
}

TEST(StopMatcher, StopAtTheVeryStart) {
  const Streamed run = feed({"\n\n"}, {"\n\nHello"});
  EXPECT_EQ(run.emitted, (Texts{"", ""}));
  EXPECT_TRUE(run.stopped);
  const Streamed split = feed({"\n\n"}, {"\n", "\n", "Hello"});
  EXPECT_EQ(split.emitted, (Texts{"", "", "", ""}));
  EXPECT_TRUE(split.stopped);
}

TEST(StopMatcher, TwoStopStringsTheFirstToAppearWins) {
  EXPECT_EQ(feed({"END", "\n"}, {"one\ntwo END"}).text, "one");
  EXPECT_EQ(feed({"END", "\n"}, {"one END\ntwo"}).text, "one ");
  const Streamed run = feed({"END", "\n"}, {"one E", "N", "D"});
  EXPECT_EQ(run.text, "one ");
  EXPECT_TRUE(run.stopped);
}

TEST(StopMatcher, TheStopThatCompletesFirstWinsEvenIfAnotherStartedEarlier) {
  // In a token stream "c" completes before "abcd" could: the stream would stop at "ab".
  StopMatcher matcher({"abcd", "c"});
  const StopMatcher::Output out = matcher.push("xabcd");
  EXPECT_EQ(out.text, "xab");
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(matcher.matched_stop(), "c");
  // Same end: the longer one (starting first) wins.
  StopMatcher same_end({"c", "bc"});
  EXPECT_EQ(same_end.push("abcd").text, "a");
  EXPECT_EQ(same_end.matched_stop(), "bc");
}

TEST(StopMatcher, NothingAfterTheStop) {
  StopMatcher matcher({"x"});
  EXPECT_EQ(matcher.push("abxcd").text, "ab");
  const StopMatcher::Output later = matcher.push("more");
  EXPECT_EQ(later.text, "");
  EXPECT_TRUE(later.stopped);
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_EQ(matcher.matched_stop(), "x");
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  const Streamed run = feed({"", "z"}, {"abc"});
  EXPECT_EQ(run.emitted, (Texts{"abc", ""}));
  EXPECT_FALSE(run.stopped);
}

TEST(StopMatcher, MultiByteStopStringCutsOnCharacterBoundaries) {
  const Streamed run = feed({"。"}, {"日本", "語\xe3", "\x80\x82", "x"});  // 。 = E3 80 82
  EXPECT_EQ(run.emitted, (Texts{"日本", "語", "", "", ""}));
  EXPECT_TRUE(run.stopped);
}

// The output must not depend on how the text is cut into deltas: compare random cuts of random
// texts over a small alphabet (so near misses and overlaps are common) with the one-piece result.
TEST(StopMatcher, OutputDoesNotDependOnHowTextIsSplit) {
  std::mt19937 rng(2024);
  const std::vector<std::string> stops = {"abab", "ba", "cab", "aaac"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int length = int(rng() % 24);
    for (int i = 0; i < length; ++i) text += "abc"[rng() % 3];

    // Expected by brute force: the earliest end over all stop strings, ties to the earliest start.
    std::string expected = text;
    bool expect_stop = false;
    for (size_t end = 1; end <= text.size() && !expect_stop; ++end) {
      for (size_t len = end; len >= 1 && !expect_stop; --len) {  // longest (earliest start) first
        const std::string candidate = text.substr(end - len, len);
        for (const std::string& s : stops) {
          if (s == candidate) {
            expected = text.substr(0, end - len);
            expect_stop = true;
            break;
          }
        }
      }
    }

    std::vector<std::string> deltas;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 4;
      deltas.push_back(text.substr(i, n));
      i += n;
    }
    const Streamed run = feed(stops, deltas);
    ASSERT_EQ(run.text, expected) << text;
    ASSERT_EQ(run.stopped, expect_stop) << text;
  }
}

}  // namespace
}  // namespace pagoda
