// Channels over real loopback sockets: ROUTER/DEALER exchange, request/reply matching, timeouts,
// a port in use.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "protocol/address_rule.h"
#include "protocol/channel.h"
#include "protocol/rpc_client.h"

namespace shardline::protocol {
namespace {

using namespace std::chrono_literals;

TEST(ChannelTest, BindPicksAPortAndDealerReachesRouter) {
  auto router = Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok()) << router.status();
  const std::string endpoint = (*router)->endpoint();
  EXPECT_EQ(endpoint.rfind("tcp://127.0.0.1:", 0), 0u);
  EXPECT_EQ(endpoint.find(":0"), std::string::npos);

  auto dealer = Channel::Connect(endpoint);
  ASSERT_TRUE(dealer.ok());
  Outgoing hello("c", "test", 1);
  hello.payload().initShutdown().setReason("hello");
  ASSERT_TRUE((*dealer)->Send(hello).ok());

  auto frame = (*router)->Receive(5s);
  ASSERT_TRUE(frame.ok() && frame->has_value());
  auto decoded = Decode((*frame)->bytes.data(), (*frame)->bytes.size(), "c");
  ASSERT_TRUE(decoded.ok()) << decoded.status;
  EXPECT_EQ(Str(decoded.message->envelope().getPayload().getShutdown().getReason()), "hello");

  // And back, addressed by the routing id.
  Outgoing reply("c", "coordinator", 1);
  reply.payload().setAck();
  ASSERT_TRUE((*router)->Send(reply, (*frame)->peer).ok());
  auto back = (*dealer)->Receive(5s);
  ASSERT_TRUE(back.ok() && back->has_value());
}

TEST(ChannelTest, ReceiveTimesOut) {
  auto router = Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok());
  const auto start = std::chrono::steady_clock::now();
  auto frame = (*router)->Receive(50ms);
  ASSERT_TRUE(frame.ok());
  EXPECT_FALSE(frame->has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 45ms);
}

TEST(ChannelTest, PortInUseIsAClearError) {
  auto first = Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  auto second = Channel::Bind((*first)->endpoint());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(second.status().message()).find("cannot listen on"), std::string::npos);
  EXPECT_NE(std::string(second.status().message()).find("in use"), std::string::npos);
}

TEST(ChannelTest, BadEndpointIsAClearError) {
  auto bad = Channel::Bind("tcp://no-such-host.invalid:12");
  EXPECT_FALSE(bad.ok());
  auto worse = Channel::Connect("carrier-pigeon://x");
  EXPECT_FALSE(worse.ok());
}

TEST(RpcClientTest, CallMatchesRepliesAndKeepsPushes) {
  auto router = Channel::Bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(router.ok());
  Channel& server = **router;
  std::thread coordinator([&server] {
    // Answers one call: first a push and a stale reply, then the real reply.
    auto frame = server.Receive(5s);
    ASSERT_TRUE(frame.ok() && frame->has_value());
    auto request = Decode((*frame)->bytes.data(), (*frame)->bytes.size(), "c");
    ASSERT_TRUE(request.ok());
    Outgoing push("c", "coordinator", 0);
    push.payload().initShutdown().setReason("push");
    ASSERT_TRUE(server.Send(push, (*frame)->peer).ok());
    Outgoing stale("c", "coordinator", request.message->request_id() + 100);
    stale.payload().setAck();
    ASSERT_TRUE(server.Send(stale, (*frame)->peer).ok());
    Outgoing reply("c", "coordinator", request.message->request_id());
    reply.payload().initSubmitJobReply().setJobId("job-1");
    ASSERT_TRUE(server.Send(reply, (*frame)->peer).ok());
  });
  auto client = RpcClient::Connect(server.endpoint(), "c", "cli", nullptr);
  ASSERT_TRUE(client.ok());
  auto request = (*client)->NewMessage();
  request->payload().initSubmitJob().setSpecYaml("x");
  auto reply = (*client)->Call(*request, 5s);
  coordinator.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(Str((*reply)->envelope().getPayload().getSubmitJobReply().getJobId()), "job-1");
  auto push = (*client)->NextMessage(1s);
  ASSERT_TRUE(push.ok() && *push);
  EXPECT_EQ((*push)->which(), wire::Envelope::Payload::SHUTDOWN);
}

TEST(RpcClientTest, UnreachableCoordinatorTimesOutNamingIt) {
  // A port nobody listens on, held for the whole test by a bound socket that never listens: a
  // port freed and looked up again could be taken meanwhile by another test's daemon (under ctest
  // -j2 this call once got a coordinator's answer in 10 ms instead of the timeout).
  const int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(held, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(getsockname(held, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{held};
  auto client = RpcClient::Connect(endpoint, "c", "cli", nullptr);
  ASSERT_TRUE(client.ok());
  auto request = (*client)->NewMessage();
  request->payload().initStatusRequest();
  auto reply = (*client)->Call(*request, 200ms);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(std::string(reply.status().message()).find(endpoint), std::string::npos);
}

TEST(LocalAddressTest, LoopbackReachesLoopback) {
  auto address = LocalAddressFor("tcp://127.0.0.1:5555");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
  EXPECT_FALSE(LocalAddressFor("tcp://nohost").ok());
}

// The address rule (protocol/address_rule.h), in its order: an explicit address, an interface's,
// the route to the coordinator. Across hosts: tests/integration/cluster_multihost_test.cc.
TEST(AddressRuleTest, ExplicitAddressThenInterfaceThenRoute) {
  auto given = ChooseAdvertisedAddress("127.0.0.1", "lo", "tcp://127.0.0.1:5555");
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->address, "127.0.0.1");
  EXPECT_EQ(given->interface, "lo");
  EXPECT_EQ(given->how, "--advertise-address");

  auto by_interface = ChooseAdvertisedAddress("", "lo", "tcp://192.0.2.1:5555");
  ASSERT_TRUE(by_interface.ok()) << by_interface.status();
  EXPECT_EQ(by_interface->address, "127.0.0.1");
  EXPECT_EQ(by_interface->how, "--interface lo");

  auto routed = ChooseAdvertisedAddress("", "", "tcp://127.0.0.1:5555");
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ(routed->address, "127.0.0.1");
  EXPECT_EQ(routed->interface, "lo");
  EXPECT_EQ(routed->how, "the interface lo routes to tcp://127.0.0.1:5555");
}

TEST(AddressRuleTest, ErrorsSayWhatWasGivenAndTried) {
  auto host_name = ChooseAdvertisedAddress("node7.cluster", "", "tcp://127.0.0.1:5555");
  ASSERT_FALSE(host_name.ok());
  EXPECT_NE(host_name.status().message().find("'node7.cluster' is not an IPv4 address"),
            std::string::npos)
      << host_name.status();

  auto no_interface = ChooseAdvertisedAddress("", "nosuch0", "tcp://127.0.0.1:5555");
  ASSERT_FALSE(no_interface.ok());
  const std::string message(no_interface.status().message());
  EXPECT_NE(message.find("interface 'nosuch0'"), std::string::npos) << message;
  EXPECT_NE(message.find("lo 127.0.0.1"), std::string::npos) << "lists what there is: " << message;

  auto unresolvable = ChooseAdvertisedAddress("", "", "tcp://nohost.invalid:5555");
  ASSERT_FALSE(unresolvable.ok());
  EXPECT_NE(unresolvable.status().message().find("give --advertise-address or --interface"),
            std::string::npos)
      << unresolvable.status();
}

TEST(AddressRuleTest, EndpointHosts) {
  EXPECT_TRUE(HasWildcardHost("tcp://0.0.0.0:5555"));
  EXPECT_TRUE(HasWildcardHost("tcp://*:5555"));
  EXPECT_FALSE(HasWildcardHost("tcp://10.0.0.1:5555"));
  EXPECT_EQ(WithHost("tcp://0.0.0.0:5555", "10.0.0.1"), "tcp://10.0.0.1:5555");
}

}  // namespace
}  // namespace shardline::protocol
