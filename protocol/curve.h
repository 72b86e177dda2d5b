// CurveZMQ keys and who may connect: the cluster's key files, the coordinator's allowlist of
// public keys with a role each, and what a client or server socket needs to speak CURVE.
//
// The key files are ZeroMQ's z85 keys in czmq's certificate layout (`NAME.key` holds the public
// key, `NAME.key_secret` both), so `zcert` tools read them too. A key directory made by
// `shardline keygen` holds:
//   coordinator.key, coordinator.key_secret   the coordinator's pair
//   node.key, node.key_secret                 agents (and the actors they spawn)
//   client.key, client.key_secret             submit, status, cancel, plan
//   allowlist                                 ROLE PUBLIC-KEY NAME, one key per line
// Every file is mode 0600 and a secret key file readable by others is refused, as ssh does.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shardline::protocol {

// What a key may do at the coordinator. A node registers a node, spawns and runs actors; a client
// submits, cancels and reads.
enum class PeerRole { kNode, kClient };
std::string_view PeerRoleName(PeerRole role);
std::optional<PeerRole> ParsePeerRole(std::string_view name);

struct CurveKeyPair {
  std::string public_key;  // z85, 40 characters
  std::string secret_key;  // z85, 40 characters; empty for a public key alone
};

// A fresh key pair from libzmq (libsodium's randomness).
absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair();
// Writes NAME.key and NAME.key_secret under `dir` (mode 0600); refuses to overwrite either.
absl::Status WriteCurveKeyPair(const std::filesystem::path& dir, const std::string& name,
                               const CurveKeyPair& pair);
// Reads NAME.key (public only) or NAME.key_secret (both, checked to belong together).
absl::StatusOr<CurveKeyPair> ReadCurvePublicKey(const std::filesystem::path& file);
absl::StatusOr<CurveKeyPair> ReadCurveKeyPair(const std::filesystem::path& file);

// The files of a key directory: the one place that names them.
struct KeyDir {
  std::filesystem::path dir;

  std::filesystem::path CoordinatorPublic() const { return dir / "coordinator.key"; }
  std::filesystem::path CoordinatorSecret() const { return dir / "coordinator.key_secret"; }
  // The default identity of a role: node.key_secret or client.key_secret.
  std::filesystem::path IdentitySecret(PeerRole role) const;
  std::filesystem::path Allowlist() const { return dir / "allowlist"; }
};

// $SHARDLINE_KEYS, else ~/.shardline/keys (as kubectl's ~/.kube).
std::filesystem::path DefaultKeyDir();

// Makes a whole key directory: the coordinator's pair, one node and one client pair, and an
// allowlist naming both. `dir` is created (mode 0700) and must not hold keys already.
absl::Status MakeKeyDir(const std::filesystem::path& dir);
// Adds one more identity (NAME.key, NAME.key_secret) to a key directory and its allowlist: one
// key per node or user, so that one can be removed without re-keying the rest.
absl::Status AddIdentity(const std::filesystem::path& dir, const std::string& name, PeerRole role);

// The public keys allowed to connect, each with its role and a name for the logs. Reloadable
// while servers read it (the coordinator reloads it on SIGHUP): thread-safe.
class Allowlist {
 public:
  struct Entry {
    PeerRole role;
    std::string name;
  };

  // Parses `file` ("ROLE Z85-PUBLIC-KEY [NAME]" per line; lines starting with '#' are comments).
  // Errors name the line.
  static absl::StatusOr<std::shared_ptr<Allowlist>> Load(std::filesystem::path file);

  // Reads the file again. On an error the old entries stay, and the error says why.
  struct Change {
    size_t keys = 0, added = 0, removed = 0;
  };
  absl::StatusOr<Change> Reload();

  std::optional<Entry> Find(std::string_view public_key) const;
  const std::filesystem::path& file() const { return file_; }

 private:
  using Entries = std::map<std::string, Entry, std::less<>>;
  explicit Allowlist(std::filesystem::path file) : file_(std::move(file)) {}
  static absl::StatusOr<Entries> Parse(const std::filesystem::path& file);

  const std::filesystem::path file_;
  mutable absl::Mutex mutex_;
  Entries entries_ ABSL_GUARDED_BY(mutex_);
};

// Told why a connection or a message was refused, from the socket's thread or the ZAP handler's
// (so thread-safe). Reasons: "no_curve" (a peer without CURVE), "handshake" (a CURVE handshake
// that failed: a wrong server key, garbage), "unknown_key" (a key not on the allowlist),
// "removed_key" (a message from a key taken off the allowlist since it connected), "role" (a
// message its key's role may not send); the coordinator adds "token" (an actor's message without
// its rank's token) and "node_key" (a node key speaking for a node another key registered).
class AuthObserver {
 public:
  virtual ~AuthObserver() = default;
  virtual void OnAuthRefused(std::string_view reason) = 0;
};

// A CURVE server socket: its own pair and who may connect.
struct ServerCurve {
  CurveKeyPair keys;
  std::shared_ptr<Allowlist> allowlist;
  AuthObserver* observer = nullptr;  // may be null
};

// A CURVE client socket: the server's public key and its own pair.
struct ClientCurve {
  std::string server_public_key;
  CurveKeyPair keys;
};

// Loads what a server or client of a key directory needs. `identity` is a NAME.key_secret file;
// empty: the role's default in `dir`.
absl::StatusOr<ServerCurve> LoadServerCurve(const KeyDir& dir);
absl::StatusOr<ClientCurve> LoadClientCurve(const KeyDir& dir, PeerRole role,
                                            const std::filesystem::path& identity = {});

// Where a process finds its CURVE keys: the flags --keys DIR, --key FILE and --insecure that
// every daemon and client takes, and that an agent hands on to its actors.
struct CurveSetup {
  std::string key_dir;   // empty: DefaultKeyDir()
  std::string identity;  // a NAME.key_secret file; empty: $SHARDLINE_KEY, else the role's default
  bool insecure = false;

  KeyDir Dir() const;
  // The command-line flags that give another process this set-up.
  std::vector<std::string> Flags() const;
};

// What the set-up gives a client of `role` / the coordinator; nullopt under --insecure. Errors
// say which file is missing or wrong and how to make it (`shardline keygen`).
absl::StatusOr<std::optional<ClientCurve>> ResolveClientCurve(const CurveSetup& setup,
                                                              PeerRole role);
absl::StatusOr<std::optional<ServerCurve>> ResolveServerCurve(const CurveSetup& setup);

}  // namespace shardline::protocol
