// CURVE over real loopback sockets: key files, the allowlist and its reload, the ZAP handler's
// decisions, and what each side is told when a handshake is refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "protocol/channel.h"
#include "protocol/curve.h"
#include "protocol/rpc_client.h"

namespace shardline::protocol {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "curve-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class CountingObserver final : public AuthObserver {
 public:
  void OnAuthRefused(std::string_view reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[std::string(reason)];
  }
  int Count(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_[reason];
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

unsigned Mode(const fs::path& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 0777;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CurveKeysTest, KeygenMakesPrivateFilesThatReadBack) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "keys";
  ASSERT_TRUE(MakeKeyDir(dir).ok());
  EXPECT_EQ(Mode(dir), 0700u);
  const KeyDir keys{dir};
  for (const fs::path& file :
       {keys.CoordinatorPublic(), keys.CoordinatorSecret(), keys.IdentitySecret(PeerRole::kNode),
        keys.IdentitySecret(PeerRole::kClient), keys.Allowlist()}) {
    EXPECT_EQ(Mode(file), 0600u) << file;
  }
  auto coordinator = ReadCurveKeyPair(keys.CoordinatorSecret());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto coordinator_public = ReadCurvePublicKey(keys.CoordinatorPublic());
  ASSERT_TRUE(coordinator_public.ok());
  EXPECT_EQ(coordinator_public->public_key, coordinator->public_key);
  EXPECT_TRUE(coordinator_public->secret_key.empty());
  // The public file never holds the secret.
  EXPECT_EQ(ReadAll(keys.CoordinatorPublic()).find(coordinator->secret_key), std::string::npos);

  auto allowlist = Allowlist::Load(keys.Allowlist());
  ASSERT_TRUE(allowlist.ok()) << allowlist.status();
  auto node = ReadCurveKeyPair(keys.IdentitySecret(PeerRole::kNode));
  auto client = ReadCurveKeyPair(keys.IdentitySecret(PeerRole::kClient));
  ASSERT_TRUE(node.ok() && client.ok());
  ASSERT_TRUE((*allowlist)->Find(node->public_key).has_value());
  EXPECT_EQ((*allowlist)->Find(node->public_key)->role, PeerRole::kNode);
  ASSERT_TRUE((*allowlist)->Find(client->public_key).has_value());
  EXPECT_EQ((*allowlist)->Find(client->public_key)->role, PeerRole::kClient);
  EXPECT_FALSE((*allowlist)->Find(coordinator->public_key).has_value());

  // Never over keys that exist.
  auto again = MakeKeyDir(dir);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
}

TEST(CurveKeysTest, BadKeyFilesAreRefusedWithTheReason) {
  TempDir tmp;
  ASSERT_TRUE(MakeKeyDir(tmp.path()).ok());
  const KeyDir keys{tmp.path()};

  fs::permissions(keys.CoordinatorSecret(), fs::perms::group_read, fs::perm_options::add);
  auto open_to_others = ReadCurveKeyPair(keys.CoordinatorSecret());
  EXPECT_EQ(open_to_others.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(open_to_others.status().message().find("chmod 600"), std::string::npos);

  auto public_only = ReadCurveKeyPair(keys.CoordinatorPublic());
  EXPECT_NE(public_only.status().message().find("no secret-key"), std::string::npos)
      << public_only.status();

  // A secret file whose public half belongs to another pair.
  auto node = ReadCurveKeyPair(keys.IdentitySecret(PeerRole::kNode));
  auto other = GenerateCurveKeyPair();
  ASSERT_TRUE(node.ok() && other.ok());
  const fs::path mixed = tmp.path() / "mixed.key_secret";
  std::ofstream(mixed) << "curve\n    public-key = \"" << other->public_key
                       << "\"\n    secret-key = \"" << node->secret_key << "\"\n";
  fs::permissions(mixed, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  EXPECT_NE(ReadCurveKeyPair(mixed).status().message().find("does not belong"), std::string::npos);

  const fs::path garbage = tmp.path() / "garbage.key";
  std::ofstream(garbage) << "curve\n    public-key = \"not a key\"\n";
  auto bad = ReadCurvePublicKey(garbage);
  EXPECT_NE(bad.status().message().find("garbage.key:2"), std::string::npos) << bad.status();

  EXPECT_EQ(ReadCurvePublicKey(tmp.path() / "missing.key").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(AllowlistTest, ParsesRolesAndNamesTheBadLine) {
  TempDir tmp;
  // A key with '#' in it (one of z85's characters) must not be read as a comment.
  CurveKeyPair hash_key;
  for (int i = 0; i < 1000 && hash_key.public_key.find('#') == std::string::npos; ++i) {
    hash_key = *GenerateCurveKeyPair();
  }
  ASSERT_NE(hash_key.public_key.find('#'), std::string::npos);
  const fs::path file = tmp.path() / "allowlist";
  std::ofstream(file) << "# comment\n\n  node " << hash_key.public_key << " worker-1\n";
  auto allowlist = Allowlist::Load(file);
  ASSERT_TRUE(allowlist.ok()) << allowlist.status();
  ASSERT_TRUE((*allowlist)->Find(hash_key.public_key).has_value());
  EXPECT_EQ((*allowlist)->Find(hash_key.public_key)->name, "worker-1");

  const auto key = GenerateCurveKeyPair()->public_key;
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {"admin " + key + "\n", ":1: unknown role 'admin'"},
           {"# ok\nclient short\n", ":2: 'short' is not a z85 CURVE public key"},
           {"client " + key + " a b\n", ":1: expected 'ROLE PUBLIC-KEY [NAME]'"},
           {"client " + key + "\nnode " + key + "\n", ":2: key " + key + " is listed twice"}}) {
    std::ofstream(file, std::ios::trunc) << text;
    auto bad = Allowlist::Load(file);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(expected), std::string::npos) << bad.status();
  }
}

TEST(AllowlistTest, ReloadAddsAndRemovesAndKeepsTheOldListOnAnError) {
  TempDir tmp;
  const auto a = GenerateCurveKeyPair()->public_key;
  const auto b = GenerateCurveKeyPair()->public_key;
  const fs::path file = tmp.path() / "allowlist";
  std::ofstream(file) << "client " << a << "\n";
  auto allowlist = Allowlist::Load(file);
  ASSERT_TRUE(allowlist.ok());
  std::ofstream(file, std::ios::trunc) << "node " << b << "\n";
  auto change = (*allowlist)->Reload();
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->keys, 1u);
  EXPECT_EQ(change->added, 1u);
  EXPECT_EQ(change->removed, 1u);
  EXPECT_FALSE((*allowlist)->Find(a).has_value());
  EXPECT_TRUE((*allowlist)->Find(b).has_value());

  std::ofstream(file, std::ios::trunc) << "nobody " << a << "\n";
  EXPECT_FALSE((*allowlist)->Reload().ok());
  EXPECT_TRUE((*allowlist)->Find(b).has_value());
}

// A CURVE ROUTER of a fresh key dir, and helpers to poke it.
class CurveChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeKeyDir(tmp_.path()).ok());
    auto server = LoadServerCurve(KeyDir{tmp_.path()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_curve_ = *server;
    server_curve_.observer = &observer_;
    auto router = Channel::Bind("tcp://127.0.0.1:0", &server_curve_);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::move(*router);
    auto client = LoadClientCurve(KeyDir{tmp_.path()}, PeerRole::kClient);
    ASSERT_TRUE(client.ok()) << client.status();
    client_curve_ = *client;
  }

  // Serves the router (as the coordinator's loop does) until `done` or 5 s.
  void ServeUntil(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      auto frame = router_->Receive(10ms);
      ASSERT_TRUE(frame.ok());
    }
  }

  // Whether `dealer` is refused: its handshake failure, after serving the router a while.
  std::string RefusalOf(Channel& dealer) {
    Outgoing hello("c", "test", 1);
    hello.payload().initShutdown().setReason("hello");
    EXPECT_TRUE(dealer.Send(hello).ok());
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (dealer.handshake_failure().empty() && std::chrono::steady_clock::now() < deadline) {
      auto frame = router_->Receive(10ms);
      EXPECT_TRUE(frame.ok());
      EXPECT_FALSE(frame.ok() && frame->has_value()) << "a refused peer's frame got through";
      (void)dealer.Receive(10ms);
    }
    return dealer.handshake_failure();
  }

  TempDir tmp_;
  CountingObserver observer_;
  ServerCurve server_curve_;
  ClientCurve client_curve_;
  std::unique_ptr<Channel> router_;
};

TEST_F(CurveChannelTest, AnAllowedKeyIsServedAndNamedOnEveryFrame) {
  auto dealer = Channel::Connect(router_->endpoint(), &client_curve_);
  ASSERT_TRUE(dealer.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*dealer)->Send(hello).ok());
  auto frame = router_->Receive(5s);
  ASSERT_TRUE(frame.ok() && frame->has_value());
  EXPECT_EQ((*frame)->user_id, client_curve_.keys.public_key);
  Outgoing reply("c", "coordinator", 1);
  reply.payload().setAck();
  ASSERT_TRUE(router_->Send(reply, (*frame)->peer).ok());
  auto back = (*dealer)->Receive(5s);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_TRUE((*dealer)->handshake_failure().empty());
}

TEST_F(CurveChannelTest, AKeyNotOnTheAllowlistIsRefusedAndCounted) {
  ClientCurve stranger = client_curve_;
  stranger.keys = *GenerateCurveKeyPair();
  auto dealer = Channel::Connect(router_->endpoint(), &stranger);
  ASSERT_TRUE(dealer.ok());
  const std::string refusal = RefusalOf(**dealer);
  EXPECT_NE(refusal.find("refused this process's CURVE key " + stranger.keys.public_key),
            std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("not on its allowlist"), std::string::npos) << refusal;
  EXPECT_TRUE((*dealer)->handshake_refused());
  EXPECT_GE(observer_.Count("unknown_key"), 1);
}

TEST_F(CurveChannelTest, APlainPeerIsRefusedBothWays) {
  auto plain = Channel::Connect(router_->endpoint());
  ASSERT_TRUE(plain.ok());
  const std::string refusal = RefusalOf(**plain);
  EXPECT_NE(refusal.find("requires CURVE keys and this process has none"), std::string::npos)
      << refusal;
  EXPECT_TRUE((*plain)->handshake_refused());
  ServeUntil([&] { return observer_.Count("no_curve") >= 1; });
  EXPECT_GE(observer_.Count("no_curve"), 1);

  // A CURVE client of a plain (--insecure) server is told to match it.
  auto plain_router = Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(plain_router.ok());
  auto curve_dealer = Channel::Connect((*plain_router)->endpoint(), &client_curve_);
  ASSERT_TRUE(curve_dealer.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*curve_dealer)->Send(hello).ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while ((*curve_dealer)->handshake_failure().empty() &&
         std::chrono::steady_clock::now() < deadline) {
    auto frame = (*plain_router)->Receive(10ms);
    ASSERT_TRUE(frame.ok());
    EXPECT_FALSE(frame->has_value());
    (void)(*curve_dealer)->Receive(10ms);
  }
  EXPECT_NE((*curve_dealer)->handshake_failure().find("does not use CURVE"), std::string::npos)
      << (*curve_dealer)->handshake_failure();
}

TEST_F(CurveChannelTest, AWrongServerKeyFailsTheHandshake) {
  ClientCurve wrong = client_curve_;
  wrong.server_public_key = GenerateCurveKeyPair()->public_key;
  auto dealer = Channel::Connect(router_->endpoint(), &wrong);
  ASSERT_TRUE(dealer.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*dealer)->Send(hello).ok());
  ServeUntil([&] { return observer_.Count("handshake") >= 1; });
  EXPECT_GE(observer_.Count("handshake"), 1);
  EXPECT_EQ(observer_.Count("unknown_key"), 0);
}

TEST_F(CurveChannelTest, RpcCallOfARefusedKeyFailsAtOnceWithTheReason) {
  ClientCurve stranger = client_curve_;
  stranger.keys = *GenerateCurveKeyPair();
  std::atomic<bool> stop{false};
  std::thread server([&] {
    while (!stop.load()) (void)router_->Receive(10ms);
  });
  auto client = RpcClient::Connect(router_->endpoint(), "c", "cli", &stranger);
  ASSERT_TRUE(client.ok());
  auto message = (*client)->NewMessage();
  message->payload().initStatusRequest();
  const auto started = std::chrono::steady_clock::now();
  auto reply = (*client)->Call(*message, 20s);
  const auto took = std::chrono::steady_clock::now() - started;
  stop.store(true);
  server.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnauthenticated) << reply.status();
  EXPECT_NE(reply.status().message().find("not on its allowlist"), std::string::npos);
  // Well before the call's own deadline: the refusal is an answer, not a silence.
  EXPECT_LT(took, 15s);
}

TEST_F(CurveChannelTest, ReloadedAllowlistTakesAndGivesBackAccessForNewConnections) {
  // Remove the client key: a new connection is refused.
  std::ofstream(KeyDir{tmp_.path()}.Allowlist(), std::ios::trunc) << "# empty\n";
  ASSERT_TRUE(server_curve_.allowlist->Reload().ok());
  auto refused = Channel::Connect(router_->endpoint(), &client_curve_);
  ASSERT_TRUE(refused.ok());
  EXPECT_NE(RefusalOf(**refused).find("not on its allowlist"), std::string::npos);

  // Put it back: the next connection is served.
  std::ofstream(KeyDir{tmp_.path()}.Allowlist(), std::ios::trunc)
      << "client " << client_curve_.keys.public_key << " back\n";
  ASSERT_TRUE(server_curve_.allowlist->Reload().ok());
  auto allowed = Channel::Connect(router_->endpoint(), &client_curve_);
  ASSERT_TRUE(allowed.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*allowed)->Send(hello).ok());
  auto frame = router_->Receive(5s);
  ASSERT_TRUE(frame.ok() && frame->has_value());
  EXPECT_EQ((*frame)->user_id, client_curve_.keys.public_key);
}

TEST_F(CurveChannelTest, TwoServersOfOneProcessKeepTheirOwnAllowlists) {
  TempDir other_dir;
  ASSERT_TRUE(MakeKeyDir(other_dir.path()).ok());
  auto other_server = LoadServerCurve(KeyDir{other_dir.path()});
  ASSERT_TRUE(other_server.ok());
  auto other_router = Channel::Bind("tcp://127.0.0.1:0", &*other_server);
  ASSERT_TRUE(other_router.ok());
  // Our client, told the other server's key, is not on the other server's list.
  ClientCurve ours_to_other = client_curve_;
  ours_to_other.server_public_key = other_server->keys.public_key;
  auto dealer = Channel::Connect((*other_router)->endpoint(), &ours_to_other);
  ASSERT_TRUE(dealer.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*dealer)->Send(hello).ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while ((*dealer)->handshake_failure().empty() && std::chrono::steady_clock::now() < deadline) {
    auto frame = (*other_router)->Receive(10ms);
    ASSERT_TRUE(frame.ok());
    EXPECT_FALSE(frame->has_value());
    (void)(*dealer)->Receive(10ms);
  }
  EXPECT_NE((*dealer)->handshake_failure().find("not on its allowlist"), std::string::npos);
}

}  // namespace
}  // namespace shardline::protocol
