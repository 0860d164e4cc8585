// SPDX-License-Identifier: Apache-2.0
// ringloaderctl top: one daemon's streams, live, as top shows processes. On a terminal it takes
// the whole screen (the alternate screen, restored on exit), redraws every second and reads keys
// (sort keys, q); otherwise it prints a plain frame a second.
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <ostream>
#include <string>

#include "client/ctl/ctl.h"
#include "client/ctl/rpc.h"
#include "client/ctl/top_view.h"
#include "proto/ringloader.grpc.pb.h"

namespace ringloader::ctl {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

// The terminal in raw mode (keys one at a time, no echo, and no signals from the keyboard: ^C
// and ^\ arrive as keys and quit, ^Z is ignored, so the terminal is always given back), for
// the object's life.
class RawTerminal {
 public:
  RawTerminal() {
    ok_ = tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (ok_) {
      termios raw = saved_;
      raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO | ISIG));
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
  }
  ~RawTerminal() {
    if (ok_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  termios saved_{};
  bool ok_ = false;
};

void ScreenSize(int* rows, int* columns) {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_row > 0 && size.ws_col > 0) {
    *rows = size.ws_row;
    *columns = size.ws_col;
  }
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int RunTop(const TopOptions& options, std::ostream& out, std::ostream& err) {
  auto channel = ChannelFor(options.endpoint);
  if (!channel.ok()) {
    err << "ringloaderctl top: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  auto stub = v1::Loader::NewStub(*channel);
  TopSort sort = TopSort::kInputBound;
  if (!options.sort.empty() && !TopSortForKey(options.sort[0], &sort)) {
    err << "ringloaderctl top: --sort " << options.sort
        << ": one of input, rate, client, dataset, id\n";
    return kExitUsage;
  }
  std::string error;  // said once the screen is the terminal's again
  int code = kExitOk;
  {
    // The terminal (raw keys, the alternate screen) and SIGINT/SIGTERM, restored however the
    // loop ends.
    struct Session {
      std::ostream& out;
      const bool screen;
      std::optional<RawTerminal> raw;
      struct sigaction old_int {
      }, old_term{};
      Session(std::ostream& o, bool s) : out(o), screen(s) {
        if (screen) {
          raw.emplace();
          out << "\033[?1049h\033[?25l" << std::flush;  // alternate screen, cursor hidden
        }
        g_interrupted = 0;
        struct sigaction action {};
        action.sa_handler = OnInterrupt;
        sigaction(SIGINT, &action, &old_int);
        sigaction(SIGTERM, &action, &old_term);
      }
      ~Session() {
        if (screen) out << "\033[?25h\033[?1049l" << std::flush;
        sigaction(SIGINT, &old_int, nullptr);
        sigaction(SIGTERM, &old_term, nullptr);
      }
    } session(out, options.screen);
    const bool screen = options.screen;
    bool keys = screen;  // read keys from stdin
    TopView view;
    for (uint64_t frame = 0; options.count == 0 || frame < options.count; ++frame) {
      grpc::ClientContext context;
      SetTimeout(context, kRpcTimeout);
      v1::GetStatsResponse stats;
      const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &stats);
      if (!status.ok()) {
        error = options.endpoint + ": " + Describe(status);
        code = ExitCodeFor(status);
        break;
      }
      view.Update(stats, Now());
      if (screen) {
        int rows = 24, columns = 80;
        ScreenSize(&rows, &columns);
        out << "\033[H\033[2J" << view.Render(options.endpoint, sort, rows, columns) << std::flush;
      } else {
        if (frame > 0) out << "\n";
        out << view.Render(options.endpoint, sort, 1 << 20, 1 << 20) << std::flush;
      }
      if (options.count != 0 && frame + 1 == options.count) break;
      // Until the next frame: keys on a terminal, else just the wait.
      const auto next = std::chrono::steady_clock::now() + options.delay;
      bool quit = false;
      while (!quit && g_interrupted == 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            next - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd key{keys ? STDIN_FILENO : -1, POLLIN, 0};
        if (poll(&key, 1, static_cast<int>(left.count())) <= 0) continue;
        char c = 0;
        if ((key.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0 || read(STDIN_FILENO, &c, 1) != 1) {
          keys = false;  // the terminal went away: frames go on, no keys to wait for
          continue;
        }
        if (c == 'q' || c == 'Q' || c == 3 /* ^C */ || c == 28 /* ^\ */) {
          quit = true;
        } else if (TopSortForKey(c, &sort)) {
          break;  // redraw at once in the new order
        }
      }
      if (quit || g_interrupted != 0) break;
    }
  }
  if (!error.empty()) err << "ringloaderctl top: " << error << "\n";
  return code;
}

}  // namespace ringloader::ctl
