#include "comm/store_listen.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/strings.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int e) {
  std::string s = std::strerror(e);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

struct Address {
  sockaddr_storage ss{};
  socklen_t len = 0;
  bool operator==(const Address& o) const { return len == o.len && std::memcmp(&ss, &o.ss, len) == 0; }
};

std::string text_of(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
}

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
}

// A literal IPv4 or IPv6 address rather than a name.
bool is_literal(const std::string& name) {
  in6_addr a6;
  in_addr a4;
  return ::inet_pton(AF_INET, name.c_str(), &a4) == 1 || ::inet_pton(AF_INET6, name.c_str(), &a6) == 1;
}

Address any_address(int family, int port) {
  Address a;
  if (family == AF_INET6) {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s->sin6_family = AF_INET6;
    s->sin6_addr = in6addr_any;
    s->sin6_port = htons(static_cast<uint16_t>(port));
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.ss);
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_ANY);
    s->sin_port = htons(static_cast<uint16_t>(port));
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

// The addresses `name` resolves to for listening, without repeats; a name that does not
// resolve yet is retried until the deadline.
std::vector<Address> resolve(const std::string& name, const std::string& from, int port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto backoff = std::chrono::milliseconds(10);
  addrinfo* res = nullptr;
  while (true) {
    const int rc = ::getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc == 0) break;
    if ((rc != EAI_NONAME && rc != EAI_AGAIN) || Clock::now() >= deadline)
      fail_dist("rank 0: cannot serve the rendezvous store on ", from, " '", name, "': it does not resolve (",
                ::gai_strerror(rc), "); name an address of rank 0's host, or set dist.bind=0.0.0.0 for every "
                "interface");
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  std::vector<Address> out;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    Address a;
    std::memcpy(&a.ss, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  ::freeaddrinfo(res);
  return out;
}

[[noreturn]] void fail_in_use(int port) {
  fail_dist("rank 0: cannot serve the rendezvous store on port ", port,
            ": address already in use (another job, or a previous run of this one, holds it): pick another "
            "MASTER_PORT");
}

// A listening socket on `a`, or -1 with errno set. `dual`: an IPv6 socket that takes
// IPv4 clients too (the any-address).
int listen_at(const Address& a, bool dual) {
  const int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const int one = 1, v6only = dual ? 0 : 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a.ss.ss_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len) == 0 && ::listen(fd, 1024) == 0) return fd;
  const int e = errno;
  ::close(fd);
  errno = e;
  return -1;
}

// Every interface: dual-stack IPv6 where the host has it (IPv4 clients arrive as mapped
// addresses), plain IPv4 otherwise.
std::vector<int> listen_everywhere(int port) {
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = listen_at(any_address(family, port), /*dual=*/true);
    if (fd >= 0) return {fd};
    const int e = errno;
    if (e == EADDRINUSE) fail_in_use(port);
    if (family == AF_INET) fail_dist("rank 0: cannot serve the rendezvous store on port ", port, ": ", errno_text(e));
  }
  fail_dist("rank 0: cannot serve the rendezvous store on port ", port);
}

}  // namespace

bool is_every_interface(const std::string& address) {
  return address == "0.0.0.0" || address == "::" || address == "*";
}

std::vector<int> open_store_listeners(const StoreBind& bind, const std::string& master_addr, int port,
                                      double timeout_s, std::string& warning) {
  warning.clear();
  const bool from_bind = !bind.address.empty();
  const std::string name = from_bind ? bind.address : master_addr;
  const std::string from = from_bind ? "dist.bind" : "MASTER_ADDR";
  if (is_every_interface(name)) return listen_everywhere(port);
  const std::vector<Address> addrs = resolve(name, from, port, timeout_s);
  std::vector<std::string> shown;
  for (const Address& a : addrs) shown.push_back(text_of(a.ss));
  const bool loopback_only =
      !addrs.empty() && std::all_of(addrs.begin(), addrs.end(), [](const Address& a) { return is_loopback(a.ss); });
  if (!from_bind && bind.other_hosts && loopback_only && !is_literal(name) && name != "localhost") {
    warning = "rendezvous: MASTER_ADDR '" + name + "' resolves to " + join(shown, ", ") +
              " on rank 0's host, a loopback address the ranks on other hosts cannot reach: the store listens on "
              "every interface instead (fix the host's name resolution, e.g. its /etc/hosts line, or set dist.bind "
              "to choose)";
    return listen_everywhere(port);
  }
  std::vector<int> fds;
  std::string why = "no address";
  for (const Address& a : addrs) {
    const int fd = listen_at(a, /*dual=*/false);
    if (fd >= 0) {
      fds.push_back(fd);
      continue;
    }
    const int e = errno;
    if (e == EADDRINUSE) {
      for (int f : fds) ::close(f);
      fail_in_use(port);
    }
    why = addrs.size() > 1 ? text_of(a.ss) + ": " + errno_text(e) : errno_text(e);
  }
  if (fds.empty())
    fail_dist("rank 0: cannot serve the rendezvous store on ", from, " '", name, "' (", join(shown, ", "), "): ", why,
              from_bind ? ": dist.bind must name an address of this host (0.0.0.0: every interface)"
                        : ": rank 0 must run on the host MASTER_ADDR names, or set dist.bind to an address of this "
                          "host (0.0.0.0: every interface)");
  return fds;
}

std::string bound_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return text_of(ss);
}

}  // namespace st
