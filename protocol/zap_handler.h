// The process's ZAP handler (ZeroMQ RFC 27): libzmq asks it, over inproc://zeromq.zap.01,
// whether each CURVE handshake's client key may connect. One per ZeroMQ context; each CURVE
// server socket registers its allowlist under a ZAP domain of its own, so that two servers of
// one process (tests) keep their own lists.
//
// Written here rather than taken from czmq's zauth: zauth has one allowlist per process, no
// roles, and no hook to count refusals by reason; the protocol itself is six frames each way.
//
// An accepted key's User-Id (zmq_msg_gets "User-Id" on every message of that connection) is its
// z85 public key, so that the server finds its role, and sees a key removed since, per message.
#pragma once

#include <memory>
#include <string>

#include "protocol/curve.h"

namespace shardline::protocol {

// Starts the handler on first use (bound before this returns, so no handshake ever finds it
// missing: libzmq lets every client in when no handler is bound). Returns the ZAP domain to set
// on the server socket.
std::string RegisterZapDomain(std::shared_ptr<const Allowlist> allowlist, AuthObserver* observer);
// A handshake for a domain no longer registered is refused.
void UnregisterZapDomain(const std::string& domain);

}  // namespace shardline::protocol
