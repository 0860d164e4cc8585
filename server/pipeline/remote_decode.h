// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decoding part of a batch on other machines (the daemon's feeders), as BatchFiller sees it.
//
// A round of a batch (batch_filler.h) may lease some of its samples: the samples go out as calls,
// each answered with a buffer laid out as a batch of exactly those samples (ComputeBatchLayout of
// their count): the good ones first, in the order asked, with their dataset indices in the
// `indices` tensor. The filler copies each good sample into its own slot only once it has checked
// the answer, on its own thread, so an answer that comes late (the lease given up) never touches
// the ring. Every sample not answered as good (a failed call, a lease past its deadline, a sample
// the other side could not decode) is decoded locally in the same round: which machine decoded a
// sample never shows in the batch.
//
// While a round's calls are late, the filler decodes samples of the next rounds that no call
// holds (their heads: their tails are leased ahead) and keeps them here as calls answered at
// once (Keep): the host's threads need not idle behind a feeder (they stop when nothing is left
// that is read already, or when memory is short), and the lead they build is what Share()
// steers by (RoundEnded).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ringloader::pipeline {

// How many rounds ahead of a stream's current one its samples are leased to feeders
// (RemoteDecode::Ahead), and how many ahead this host decodes while a round's calls are late
// (RemoteDecode::Keep; past the rounds leased ahead only their heads, their tails being for the
// feeders). AheadCalls keeps a call unclaimed that many batches, by its kind.
inline constexpr int kLeaseAheadRounds = 2;
inline constexpr int kDecodeAheadRounds = 4;

// An answer's bytes as they came: one buffer, or the pieces a feeder's answer arrived in (gRPC's
// slices, read in place rather than copied into one buffer first: the host copied each sample
// twice, into the answer and then into its slot). Read by offset. Does not own the pieces: its
// call does.
class AnswerView {
 public:
  AnswerView() = default;
  explicit AnswerView(std::span<const uint8_t> whole);
  explicit AnswerView(std::vector<std::span<const uint8_t>> pieces);

  uint64_t size() const { return size_; }
  // Copies bytes [offset, offset + dest.size()) into `dest`. REQUIRES: within size().
  void Copy(uint64_t offset, std::span<uint8_t> dest) const;
  // The 8 bytes at `offset` as an int64 (the layout's indices, labels and row counts).
  int64_t Int64At(uint64_t offset) const;

 private:
  std::vector<std::span<const uint8_t>> pieces_;
  std::vector<uint64_t> starts_;  // each piece's first offset
  uint64_t size_ = 0;
};

// One call decoding samples elsewhere. Thread-safe.
class RemoteCall {
 public:
  virtual ~RemoteCall() = default;
  // The dataset indices asked for, in order (the answer is laid out for all of them; a call
  // started ahead may hold some the round does not).
  virtual const std::vector<uint64_t>& indices() const = 0;
  // Blocks until the call has ended, its lease runs out, or `slice` has passed (then nullopt: ask
  // again, after checking whether the stream stopped). OK: `payload()` is the answer, checked for
  // size and checksum. Otherwise why the call gave nothing (its samples are decoded locally).
  virtual std::optional<absl::Status> Wait(std::chrono::milliseconds slice) = 0;
  // Whether the answer (or the call's failure) is in, or its lease ran out: Wait would return at
  // once. Never blocks: while it says no, the filler decodes samples of the rounds to come.
  virtual bool Answered() const = 0;
  // The call was this host's own (samples of a round to come, decoded while an earlier round
  // waited for its feeders): not counted as decoded elsewhere.
  virtual bool DecodedHere() const { return false; }
  // After Wait() returned OK: the good samples' count and the answer's bytes (valid while the
  // call lives).
  virtual uint32_t count() const = 0;
  virtual AnswerView payload() const = 0;
  // The answer was used: `used` of its good samples are in their slots (counted as the
  // feeder's; a call started ahead may hold samples another round had).
  virtual void Accept(uint32_t used) = 0;
  // The answer was unusable after all (an index not asked for, a label or length out of place):
  // reported against the feeder, and the call's samples are decoded locally.
  virtual void Reject(const absl::Status& why) = 0;
};

// Where a stream's rounds lease samples. Thread-safe.
class RemoteDecode {
 public:
  virtual ~RemoteDecode() = default;
  // How many of a round's `k` samples to decode elsewhere now (0 = all here): the share that
  // ends the round soonest given how fast the local threads and the feeders have been, or all of
  // them when the host's threads are kept for its trainers (server.local_decode = false).
  virtual uint64_t Share(uint64_t k) = 0;
  // Starts decoding `indices` of `epoch` elsewhere, split into calls; indices no feeder takes
  // now are left out (decoded locally).
  virtual std::vector<std::unique_ptr<RemoteCall>> Start(uint64_t epoch,
                                                         std::span<const uint64_t> indices) = 0;
  // Leases ahead: the samples a round to come will likely lease (its tail; called each round for
  // each of the next few), started now so that the other side decodes them while earlier rounds
  // are collected and the trainer reads. Samples already leased ahead are not asked again. Their
  // bytes depend only on (dataset, seed, epoch, sample), so they serve whichever round holds
  // them. Default: none.
  virtual void Ahead(uint64_t epoch, std::span<const uint64_t> indices) {
    (void)epoch;
    (void)indices;
  }
  // The calls started ahead that hold any of `indices` of `epoch`, now this round's. One that
  // the first rounds of kLeaseAheadRounds batches in a row did not claim (kDecodeAheadRounds for
  // one decoded here) is given up (the rounds moved past it). `batch_begins`: the round is its
  // batch's first; a later one (refilling the slots of samples that failed) takes samples of the
  // rounds to come, whose calls it must not age. Default: none.
  virtual std::vector<std::unique_ptr<RemoteCall>> Claim(uint64_t epoch,
                                                         std::span<const uint64_t> indices,
                                                         bool batch_begins) {
    (void)epoch;
    (void)indices;
    (void)batch_begins;
    return {};
  }
  // Holds `call`, decoded on this host while a round waited for its feeders' answers, for the
  // round of `epoch` that holds its samples: handed over by Claim like a call started ahead, and
  // given up the same way.
  virtual void Keep(uint64_t epoch, std::unique_ptr<RemoteCall> call) = 0;
  // Of `indices` of `epoch`, those no call held here (started ahead, or kept) asks for.
  virtual std::vector<uint64_t> Unheld(uint64_t epoch, std::span<const uint64_t> indices) const = 0;
  // What a round's local decodes took (`samples` in `elapsed`), for Share().
  virtual void LocalDone(uint64_t samples, std::chrono::nanoseconds elapsed) = 0;
  // A shared round's end, what Share() steers by: of its `k` samples, `behind` were decoded in
  // the round itself (not ahead: this host fell behind its feeders), and it `waited` for its
  // calls' answers with nothing left to decode (its feeders fell behind). Default: ignored.
  virtual void RoundEnded(uint64_t k, uint64_t behind, std::chrono::nanoseconds waited) {
    (void)k;
    (void)behind;
    (void)waited;
  }
};

// The calls one stream started ahead (and those it decoded ahead, kept), until a round claims them: the bookkeeping behind
// RemoteDecode::Ahead and Claim, for an implementation to hold. Not thread-safe (a stream's
// producer alone uses it).
class AheadCalls {
 public:
  // Of `indices` of `epoch`, those no call held here asks for: what is left to start ahead. None
  // when they are fewer than `least` next to some held already (the share grew a little since:
  // not worth a call of their own; the round leases them itself).
  std::vector<uint64_t> Fresh(uint64_t epoch, std::span<const uint64_t> indices,
                              size_t least) const;
  void Add(uint64_t epoch, std::unique_ptr<RemoteCall> call);
  // The calls of `epoch` that hold any of `indices`, handed over. One that kLeaseAheadRounds
  // claims with `ages` in a row did not take is dropped (the rounds moved past it: given up as it
  // goes; its answer's memory_limit reservation with it); one decoded here, kDecodeAheadRounds.
  std::vector<std::unique_ptr<RemoteCall>> Claim(uint64_t epoch, std::span<const uint64_t> indices,
                                                 bool ages);
  size_t size() const { return held_.size(); }
  // Good samples held by calls decoded here (RemoteCall::DecodedHere): this host's lead.
  size_t HeldHere() const;

 private:
  struct Held {
    uint64_t epoch;
    std::unique_ptr<RemoteCall> call;
    int passed;  // claims that aged it (batches begun) since it was started
  };
  std::vector<Held> held_;
};

}  // namespace ringloader::pipeline
