// Where rank 0's rendezvous store listens. By default on the address the job names
// (MASTER_ADDR, the address every rank connects to), so the store of a job whose ranks
// meet on 127.0.0.1 cannot be reached from the network at all; `dist.bind` names
// another address, or every interface ("0.0.0.0", "::" or "*").
#pragma once
#include <string>
#include <vector>

namespace st {

struct StoreBind {
  // dist.bind: "" listens where the ranks connect (the master address); "0.0.0.0", "::"
  // or "*" on every interface (IPv6 and IPv4 where the host has both); anything else is
  // a host name or address of rank 0's host.
  std::string address;
  // Ranks on other hosts take part. A master host name (not a literal address, not
  // "localhost") that resolves to loopback addresses only on rank 0's host (Debian's
  // /etc/hosts maps the host's own name to 127.0.1.1) could not be reached by them:
  // then the store listens on every interface, with a warning.
  bool other_hosts = false;
};

// True for "0.0.0.0", "::" and "*".
bool is_every_interface(const std::string& address);

// Listening sockets (non-blocking, close-on-exec, SO_REUSEADDR) for `port` on every
// address that `bind.address` (or, when it is empty, `master_addr`) resolves to on this
// host; a name that does not resolve yet is retried until `timeout_s` (a Kubernetes
// pod's name appears in DNS once its pod is up). Errors (st::Error, distributed, exit 4)
// name the address, where it came from (MASTER_ADDR or dist.bind) and what to do: the
// port in use, a name that does not resolve, an address that is not this host's.
// `warning` receives a line for the caller to print when the store listens more widely
// than asked (see StoreBind::other_hosts), "" otherwise.
std::vector<int> open_store_listeners(const StoreBind& bind, const std::string& master_addr, int port,
                                      double timeout_s, std::string& warning);

// "127.0.0.1:29500", "[::]:29500": the address a socket is bound to (getsockname).
std::string bound_address(int fd);

}  // namespace st
