// The coordinator's key-value store: quotas per job namespace, and their accounting through
// overwrites, adds and the erasure of a generation's keys.
#include "coordinator/kv_store.h"

#include <gtest/gtest.h>

namespace shardline::coordinator {
namespace {

TEST(KvStoreTest, EachJobHasItsOwnQuotaOfKeys) {
  KvStore store(KvQuota{.keys = 3, .bytes = 1 << 20});
  for (int i = 0; i < 3; ++i) {
    const std::string key = "job/a/gen/1/k" + std::to_string(i);
    ASSERT_TRUE(store.CheckQuota(key, 1).ok());
    store.Set(key, "x");
  }
  const absl::Status full = store.CheckQuota("job/a/gen/1/k3", 1);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("namespace job/a/"), std::string::npos) << full;
  // Overwriting a key it holds takes no new one; another job's namespace is untouched.
  EXPECT_TRUE(store.CheckQuota("job/a/gen/1/k0", 1).ok());
  EXPECT_TRUE(store.CheckQuota("job/b/gen/1/k0", 1).ok());
  EXPECT_TRUE(store.CheckQuota("other/key", 1).ok());
  // A generation's keys erased: the quota is free again.
  store.ErasePrefix("job/a/");
  EXPECT_TRUE(store.CheckQuota("job/a/gen/2/k3", 1).ok());
  EXPECT_EQ(store.size(), 0u);
}

TEST(KvStoreTest, BytesCountKeysAndValuesThroughOverwritesAndAdds) {
  KvStore store(KvQuota{.keys = 100, .bytes = 64});
  store.Set("job/a/k", std::string(40, 'v'));  // 7 + 40 = 47 bytes
  EXPECT_TRUE(store.CheckQuota("job/a/k", 57).ok());  // replaces the 40: 7 + 57 = 64
  EXPECT_EQ(store.CheckQuota("job/a/k", 58).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.CheckQuota("job/a/j", 10).ok());  // 47 + 7 + 10 = 64
  EXPECT_EQ(store.CheckQuota("job/a/j", 11).code(), absl::StatusCode::kResourceExhausted);
  store.Set("job/a/k", "v");  // 8 bytes now
  EXPECT_TRUE(store.CheckQuota("job/a/j", 40).ok());
  ASSERT_TRUE(store.Add("job/a/n", 12345).ok());  // 7 + 5
  ASSERT_TRUE(store.Add("job/a/n", 1).ok());
  EXPECT_TRUE(store.CheckQuota("job/a/j", 64 - 8 - 12 - 7).ok());
  EXPECT_FALSE(store.CheckQuota("job/a/j", 64 - 8 - 12 - 7 + 1).ok());
}

}  // namespace
}  // namespace shardline::coordinator
