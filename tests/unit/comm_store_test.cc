// InMemoryStore, PrefixStore and FileStore: the bootstrap stores every communicator goes through.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/file_store.h"
#include "worker/comm/store.h"

namespace shardline::comm {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

TEST(InMemoryStoreTest, SetThenGet) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  auto value = store.Get("a", milliseconds(0));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "1");
}

TEST(InMemoryStoreTest, SetOverwritesAndKeepsBinaryValues) {
  InMemoryStore store;
  const std::string binary("\0\x01\xff", 3);
  ASSERT_TRUE(store.Set("k", "old").ok());
  ASSERT_TRUE(store.Set("k", binary).ok());
  auto value = store.Get("k", milliseconds(0));
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, binary);
}

TEST(InMemoryStoreTest, GetWaitsForASetFromAnotherThread) {
  InMemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ASSERT_TRUE(store.Set("late", "here").ok());
  });
  const auto start = std::chrono::steady_clock::now();
  auto value = store.Get("late", milliseconds(5000));
  const auto waited = std::chrono::steady_clock::now() - start;
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
  EXPECT_GE(waited, milliseconds(40));
  EXPECT_LT(waited, milliseconds(4000));
}

TEST(InMemoryStoreTest, GetTimesOutNamingKeyAndTimeout) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("other", "x").ok());
  const auto start = std::chrono::steady_clock::now();
  auto value = store.Get("missing", milliseconds(100));
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("'missing'"));
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("100 ms"));
  EXPECT_GE(waited, milliseconds(90));
}

TEST(InMemoryStoreTest, UnrelatedSetsDoNotExtendTheWait) {
  InMemoryStore store;
  std::atomic<bool> stop{false};
  std::thread noise([&] {
    for (int i = 0; !stop; ++i) {
      (void)store.Set("noise", std::to_string(i));
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  auto value = store.Get("missing", milliseconds(100));
  const auto waited = std::chrono::steady_clock::now() - start;
  stop = true;
  noise.join();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(waited, milliseconds(1000));
}

TEST(InMemoryStoreTest, AddStartsFromZeroAndIsAtomic) {
  InMemoryStore store;
  auto first = store.Add("n", 5);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, 5);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) ASSERT_TRUE(store.Add("n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto total = store.Add("n", -5);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, 4000);
  auto text = store.Get("n", milliseconds(0));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "4000");
}

TEST(InMemoryStoreTest, AddOnANonIntegerFails) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("s", "abc").ok());
  auto result = store.Add("s", 1);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("'s'"));
}

TEST(InMemoryStoreTest, AddWakesAWaiter) {
  InMemoryStore store;
  std::thread adder([&] {
    std::this_thread::sleep_for(milliseconds(30));
    ASSERT_TRUE(store.Add("counter", 2).ok());
  });
  auto value = store.Get("counter", milliseconds(5000));
  adder.join();
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, "2");
}

TEST(PrefixStoreTest, PutsThePrefixBeforeEveryKey) {
  InMemoryStore inner;
  PrefixStore gen1("job/gen1", inner);
  PrefixStore gen2("job/gen2", inner);
  ASSERT_TRUE(gen1.Set("k", "one").ok());
  ASSERT_TRUE(gen2.Set("k", "two").ok());
  EXPECT_EQ(*inner.Get("job/gen1/k", milliseconds(0)), "one");
  EXPECT_EQ(*gen2.Get("k", milliseconds(0)), "two");
  EXPECT_EQ(*gen1.Add("n", 3), 3);
  EXPECT_EQ(*inner.Get("job/gen1/n", milliseconds(0)), "3");
  auto missing = gen2.Get("n", milliseconds(10));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("job/gen2/n"));
}

TEST(PrefixStoreTest, Nests) {
  InMemoryStore inner;
  PrefixStore outer("a", inner);
  PrefixStore nested("b", outer);
  ASSERT_TRUE(nested.Set("c", "v").ok());
  EXPECT_EQ(*inner.Get("a/b/c", milliseconds(0)), "v");
}

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shardline_file_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(FileStoreTest, SetGetAddAndTimeout) {
  auto store = FileStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status();
  // Keys with '/' and '.' must work: they are encoded into file names.
  ASSERT_TRUE((*store)->Set("gen1/gloo/0", std::string("\0bin", 4)).ok());
  auto value = (*store)->Get("gen1/gloo/0", milliseconds(100));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\0bin", 4));
  EXPECT_EQ(*(*store)->Add(".count", 2), 2);
  EXPECT_EQ(*(*store)->Add(".count", 3), 5);
  auto missing = (*store)->Get("nope", milliseconds(50));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
}

TEST_F(FileStoreTest, SecondHandleSeesTheFirstOnesKeys) {
  auto writer = FileStore::Open(dir_);
  auto reader = FileStore::Open(dir_);
  ASSERT_TRUE(writer.ok() && reader.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    ASSERT_TRUE((*writer)->Set("k", "v").ok());
  });
  auto value = (*reader)->Get("k", milliseconds(5000));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(FileStoreOpenTest, MissingDirectoryIsAnError) {
  auto store = FileStore::Open("/nonexistent/shardline/dir");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("/nonexistent/shardline/dir"));
}

}  // namespace
}  // namespace shardline::comm
