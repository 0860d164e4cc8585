// SPDX-License-Identifier: Apache-2.0
// delayfs: a read-only FUSE passthrough of a directory that adds a delay to every file open, as
// a network mount (NFS, Lustre, s3fs, gcsfuse) costs per file. For the storage tests and
// bench/storage_bench. Not part of the daemon.
//
//   delayfs SOURCE MOUNTPOINT [--open-delay-ms N] [--hang GLOB] [--threads N] [--stats FILE]
//           [--held FILE] [--stop-with-eio] [--stop-after-reads N]
//
// The delay applies to every open of a file or a directory (a listing costs a round trip too).
// --stats FILE: written at exit: "files N dirs M", the most opens of files (of directories) that
// waited at once: 1 means the reader opened one after another.
// --hang GLOB: opening a file whose path (relative to SOURCE, fnmatch) matches never answers,
// like a dead mount, until the caller is killed (EINTR: as NFS's killable waits) or delayfs
// exits (ENOTCONN).
// SIGUSR1: the whole mount stops answering, as an NFS server that goes away: every open, listing
// and read that reaches delayfs waits (pages the kernel cached still read) until SIGUSR2 answers
// them all again, the caller is killed (EINTR) or delayfs exits (ENOTCONN).
// --stop-with-eio: while stopped, every such request fails at once with EIO instead, as a soft
// NFS mount whose server is gone answers; --held then counts those failures so far.
// --stop-after-reads N: the mount stops (as on SIGUSR1) by itself at the (N+1)th read of file
// data, for a test that needs the outage to begin in the middle of a file being read.
// --held FILE: how many requests wait unanswered now, rewritten whenever it changes. Runs in the
// foreground; SIGTERM or SIGINT unmounts and exits. Multithreaded (--threads, default 256), so
// concurrent opens wait their delays side by side, as on a real mount.
#define FUSE_USE_VERSION 314
#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Settings {
  std::string source;
  std::chrono::milliseconds open_delay{0};
  std::string hang_glob;
  std::string stats_path;
  bool stop_with_eio = false;
  uint64_t stop_after_reads = 0;  // 0: never
};
Settings settings;
struct Concurrency {
  std::atomic<int> now{0};
  std::atomic<int> peak{0};
};
Concurrency files, dirs;
std::atomic<bool> stopped{false};  // SIGUSR1 sets, SIGUSR2 clears
std::string held_path;
std::mutex held_mu;
int held = 0;  // requests waiting while stopped (--stop-with-eio: failed so far)

void WriteHeld(int delta) {
  std::lock_guard<std::mutex> lock(held_mu);
  held += delta;
  if (held_path.empty()) return;
  const std::string tmp = held_path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%d\n", held);
    std::fclose(f);
    std::rename(tmp.c_str(), held_path.c_str());
  }
}

// The delay, counted among the opens (of `kind`) waiting at once.
void Delay(Concurrency& kind) {
  const int now = ++kind.now;
  int peak = kind.peak.load();
  while (now > peak && !kind.peak.compare_exchange_weak(peak, now)) {
  }
  std::this_thread::sleep_for(settings.open_delay);
  --kind.now;
}

std::string Source(const char* path) { return settings.source + path; }

bool Exiting() {
  fuse_context* context = fuse_get_context();
  return context == nullptr || fuse_session_exited(fuse_get_session(context->fuse)) != 0;
}

// While the mount is stopped (SIGUSR1): waits for SIGUSR2. 0 to go on, or the error to answer
// (the caller was killed, or delayfs exits).
int HoldWhileStopped() {
  if (!stopped.load()) return 0;
  WriteHeld(+1);
  if (settings.stop_with_eio) return -EIO;
  while (stopped.load() && !Exiting() && fuse_interrupted() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  WriteHeld(-1);
  if (!stopped.load()) return 0;
  return fuse_interrupted() != 0 ? -EINTR : -ENOTCONN;
}

int GetAttr(const char* path, struct stat* st, fuse_file_info*) {
  return lstat(Source(path).c_str(), st) == 0 ? 0 : -errno;
}

int OpenDir(const char* path, fuse_file_info*) {
  if (const int held_error = HoldWhileStopped(); held_error != 0) return held_error;
  Delay(dirs);
  struct stat st {};
  return lstat(Source(path).c_str(), &st) == 0 ? 0 : -errno;
}

int ReadDir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*,
            fuse_readdir_flags) {
  DIR* dir = opendir(Source(path).c_str());
  if (dir == nullptr) return -errno;
  while (dirent* e = readdir(dir)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  closedir(dir);
  return 0;
}

int Open(const char* path, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  if (!settings.hang_glob.empty() && fnmatch(settings.hang_glob.c_str(), path + 1, 0) == 0) {
    // Until the caller is killed (the kernel then sends an interrupt, which a network
    // filesystem's killable waits honour too) or delayfs exits.
    while (!Exiting() && fuse_interrupted() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return fuse_interrupted() != 0 ? -EINTR : -ENOTCONN;
  }
  if (const int held_error = HoldWhileStopped(); held_error != 0) return held_error;
  Delay(files);
  const int fd = open(Source(path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  // The kernel keeps the file's pages across opens, as an NFS client does: an open still pays
  // the delay, a read of pages seen before does not cross into this process.
  fi->keep_cache = 1;
  return 0;
}

int Read(const char*, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  static std::atomic<uint64_t> reads{0};
  if (settings.stop_after_reads != 0 && ++reads == settings.stop_after_reads + 1) {
    stopped.store(true);
  }
  if (const int held_error = HoldWhileStopped(); held_error != 0) return held_error;
  const ssize_t n = pread(static_cast<int>(fi->fh), buf, size, offset);
  return n < 0 ? -errno : static_cast<int>(n);
}

int Release(const char*, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  return 0;
}

int StatFs(const char* path, struct statvfs* st) {
  return statvfs(Source(path).c_str(), st) == 0 ? 0 : -errno;
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "delayfs: %s\nusage: delayfs SOURCE MOUNTPOINT [--open-delay-ms N] [--hang GLOB] "
               "[--threads N] [--stats FILE] [--held FILE] [--stop-with-eio]\n"
               "       [--stop-after-reads N]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  unsigned threads = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value of " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--open-delay-ms") {
      settings.open_delay = std::chrono::milliseconds(std::stoul(value()));
    } else if (arg == "--hang") {
      settings.hang_glob = value();
    } else if (arg == "--stats") {
      settings.stats_path = value();
    } else if (arg == "--held") {
      held_path = value();
    } else if (arg == "--stop-after-reads") {
      settings.stop_after_reads = std::stoull(value());
    } else if (arg == "--stop-with-eio") {
      settings.stop_with_eio = true;
    } else if (arg == "--threads") {
      threads = static_cast<unsigned>(std::stoul(value()));
    } else if (!arg.empty() && arg[0] == '-') {
      Usage(("unknown flag " + arg).c_str());
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) Usage("needs SOURCE and MOUNTPOINT");
  char* source = realpath(positional[0].c_str(), nullptr);
  if (source == nullptr) Usage(("cannot resolve SOURCE: " + std::string(strerror(errno))).c_str());
  settings.source = source;
  std::free(source);

  fuse_operations ops{};
  ops.getattr = GetAttr;
  ops.opendir = OpenDir;
  ops.readdir = ReadDir;
  ops.open = Open;
  ops.read = Read;
  ops.release = Release;
  ops.statfs = StatFs;
  // Root may let every user read it (a daemon tested as another user). Names and attributes are
  // cached for a minute, as NFS clients cache them (acregmax): only opens pay the delay.
  std::vector<std::string> args = {
      "delayfs", "-o",
      "ro,default_permissions,fsname=delayfs,entry_timeout=60,attr_timeout=60"};
  if (geteuid() == 0) args.back() += ",allow_other";
  std::vector<char*> argv_fuse;
  for (std::string& a : args) argv_fuse.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv_fuse.size()), argv_fuse.data());
  fuse* fs = fuse_new(&fargs, &ops, sizeof(ops), nullptr);
  if (fs == nullptr) return 1;
  if (fuse_mount(fs, positional[1].c_str()) != 0) {
    fuse_destroy(fs);
    return 1;
  }
  fuse_session* session = fuse_get_session(fs);
  if (fuse_set_signal_handlers(session) != 0) return 1;
  signal(SIGUSR1, [](int) { stopped.store(true); });
  signal(SIGUSR2, [](int) { stopped.store(false); });
  WriteHeld(0);
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, threads);
  fuse_loop_cfg_set_idle_threads(config, threads);  // threads kept, not made anew per burst
  const int rc = fuse_loop_mt(fs, config);
  fuse_loop_cfg_destroy(config);
  fuse_remove_signal_handlers(session);
  fuse_unmount(fs);
  fuse_destroy(fs);
  if (!settings.stats_path.empty()) {
    if (FILE* f = std::fopen(settings.stats_path.c_str(), "w")) {
      std::fprintf(f, "files %d dirs %d\n", files.peak.load(), dirs.peak.load());
      std::fclose(f);
    }
  }
  return rc == 0 ? 0 : 1;
}
