// SPDX-License-Identifier: Apache-2.0
// netem_queue: packet delay and loss for kernels without sch_netem, from user space. Packets an
// iptables NFQUEUE rule sends to queue N are held here and given back to the kernel `delay`
// later, in the order they came, except a seeded `loss` fraction that is dropped: what
// `tc qdisc ... netem delay D loss L` does to the same packets. For the feeder tests and
// bench/feeder_bench. Not part of the daemon.
//
//   netem_queue --queue N [--delay-ms D] [--loss-percent L] [--seed S] [--stats FILE]
//
// Runs in the network namespace whose rules name the queue (netlink is per namespace). Prints
// "ready" on stdout once it holds the queue, so a caller adds its rule only then (a packet sent
// to a queue no one holds is dropped). SIGTERM or SIGINT: every held packet is released at once,
// and --stats FILE is written: "packets P dropped D lost_messages M" (M: netlink overruns, whose
// packets were held until exit).
#include <arpa/inet.h>
#include <errno.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int queue = -1;
  int delay_ms = 50;
  double loss_percent = 0;
  uint64_t seed = 1;
  std::string stats_path;
};

struct Held {
  uint32_t id;
  Clock::time_point release;
};

// What the packet callback needs: the queue, the packets held, the loss draw.
struct Line {
  nfq_q_handle* queue = nullptr;
  std::deque<Held> held;
  std::mt19937_64 random;
  std::bernoulli_distribution lose{0.0};
  std::chrono::milliseconds delay{0};
  uint64_t packets = 0, dropped = 0;
};

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "netem_queue: %s\nusage: netem_queue --queue N [--delay-ms D] "
               "[--loss-percent L] [--seed S] [--stats FILE]\n",
               why);
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + flag).c_str());
    const char* value = argv[++i];
    char* end = nullptr;
    errno = 0;
    if (flag == "--queue") {
      o.queue = static_cast<int>(std::strtol(value, &end, 10));
    } else if (flag == "--delay-ms") {
      o.delay_ms = static_cast<int>(std::strtol(value, &end, 10));
    } else if (flag == "--loss-percent") {
      o.loss_percent = std::strtod(value, &end);
    } else if (flag == "--seed") {
      o.seed = std::strtoull(value, &end, 10);
    } else if (flag == "--stats") {
      o.stats_path = value;
      continue;
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
    if (errno != 0 || end == value || *end != '\0') {
      Usage(("not a number for " + flag + ": " + value).c_str());
    }
  }
  if (o.queue < 0 || o.queue > 65535) Usage("--queue N (0-65535) is required");
  if (o.delay_ms < 0) Usage("--delay-ms must be >= 0");
  if (o.loss_percent < 0 || o.loss_percent > 100) Usage("--loss-percent must be 0-100");
  return o;
}

// Each packet: dropped now with probability `loss`, else held until its release time.
int OnPacket(nfq_q_handle* queue, nfgenmsg*, nfq_data* data, void* context) {
  auto* line = static_cast<Line*>(context);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  const uint32_t id = ntohl(header->packet_id);
  ++line->packets;
  if (line->lose(line->random)) {
    ++line->dropped;
    return nfq_set_verdict(queue, id, NF_DROP, 0, nullptr);
  }
  line->held.push_back({id, Clock::now() + line->delay});
  return 0;
}

// Gives back every held packet due by `now` (all of them when `all`).
void Release(Line& line, Clock::time_point now, bool all) {
  while (!line.held.empty() && (all || line.held.front().release <= now)) {
    nfq_set_verdict(line.queue, line.held.front().id, NF_ACCEPT, 0, nullptr);
    line.held.pop_front();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  Line line;
  line.random.seed(options.seed);
  line.lose = std::bernoulli_distribution(options.loss_percent / 100.0);
  line.delay = std::chrono::milliseconds(options.delay_ms);

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::fprintf(stderr, "netem_queue: nfq_open: %s\n", std::strerror(errno));
    return 1;
  }
  line.queue = nfq_create_queue(handle, static_cast<uint16_t>(options.queue), &OnPacket, &line);
  if (line.queue == nullptr) {
    std::fprintf(stderr, "netem_queue: cannot hold queue %d: %s\n", options.queue,
                 std::strerror(errno));
    return 1;
  }
  // Headers only: the packet's bytes stay in the kernel, and a GSO packet is not split for us.
  if (nfq_set_mode(line.queue, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(line.queue, 65536) < 0 ||
      nfq_set_queue_flags(line.queue, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0) {
    std::fprintf(stderr, "netem_queue: configuring queue %d: %s\n", options.queue,
                 std::strerror(errno));
    return 1;
  }
  // A burst of packets must not overflow the socket: a message lost there is a packet held in
  // the kernel forever.
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 32u << 20);
  const int fd = nfq_fd(handle);
  struct sigaction stop {};
  stop.sa_handler = &OnStop;
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
  std::printf("ready\n");
  std::fflush(stdout);

  alignas(8) char buffer[1 << 16];
  uint64_t lost_messages = 0;
  while (!g_stop) {
    // At most 100 ms: a SIGTERM that lands just before poll() is seen soon all the same.
    int wait_ms = 100;
    if (!line.held.empty()) {
      const auto until = line.held.front().release - Clock::now();
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::ceil<std::chrono::milliseconds>(until).count(), 0, 100));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready > 0) {
      // Everything waiting in the socket, then back to the clock.
      for (;;) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n > 0) {
          nfq_handle_packet(handle, buffer, static_cast<int>(n));
          continue;
        }
        if (n < 0 && errno == ENOBUFS) {  // their packets wait in the kernel until exit
          std::fprintf(stderr, "netem_queue: netlink messages lost (ENOBUFS)\n");
          ++lost_messages;
          continue;
        }
        break;
      }
    }
    Release(line, Clock::now(), false);
  }
  Release(line, Clock::now(), true);
  nfq_destroy_queue(line.queue);
  nfq_close(handle);
  if (!options.stats_path.empty()) {
    if (FILE* f = std::fopen(options.stats_path.c_str(), "w")) {
      std::fprintf(f, "packets %llu dropped %llu lost_messages %llu\n",
                   static_cast<unsigned long long>(line.packets),
                   static_cast<unsigned long long>(line.dropped),
                   static_cast<unsigned long long>(lost_messages));
      std::fclose(f);
    }
  }
  return 0;
}
