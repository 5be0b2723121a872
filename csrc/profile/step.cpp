// The step breakdown (innermost phase wins, the rest is Other) and the C++ StepProfiler.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "profile/recorder_internal.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::profile {

StepRecord breakdown(const std::vector<Event>& events, uint64_t begin, uint64_t end) {
  StepRecord rec;
  rec.begin_ns = ticks_to_ns(begin);
  rec.end_ns = ticks_to_ns(std::max(begin, end));
  if (end <= begin) return rec;
  struct Span {
    uint64_t b, e;
    int phase;
  };
  // Scratch reused across calls on this thread: a step() allocates nothing once warm.
  thread_local std::vector<Span> spans;
  thread_local std::vector<const Span*> open;
  spans.clear();
  open.clear();
  for (const Event& ev : events) {
    const int p = static_cast<int>(ev.phase);
    if (p >= kNumPhases) continue;  // plain ranges: their time stays with the phase around them
    const uint64_t b = std::max(ev.begin, begin), e = std::min(ev.end, end);
    if (e > b) spans.push_back(Span{b, e, p});
  }
  // Outer ranges first: by begin, and for the same begin the longer one.
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.b != y.b ? x.b < y.b : x.e > y.e; });
  // Ticks per phase; at each instant the innermost open span (the latest begun) owns the time.
  uint64_t ticks_in[kNumPhases] = {};
  uint64_t t = begin;
  const auto advance_to = [&](uint64_t target) {
    while (t < target) {
      open.erase(std::remove_if(open.begin(), open.end(), [&](const Span* s) { return s->e <= t; }),
                 open.end());
      uint64_t seg_end = target;
      for (const Span* s : open) seg_end = std::min(seg_end, s->e);
      ticks_in[open.empty() ? static_cast<int>(Phase::Other) : open.back()->phase] += seg_end - t;
      t = seg_end;
    }
  };
  for (const Span& s : spans) {
    advance_to(s.b);
    open.push_back(&s);
  }
  advance_to(end);
  // Ticks to ns per phase, with the rounding put into Other so the phases sum to the step exactly.
  const int64_t total = rec.end_ns - rec.begin_ns;
  int64_t assigned = 0;
  for (int p = 0; p < kNumPhases; ++p) {
    if (p == static_cast<int>(Phase::Other)) continue;
    rec.phase_ns[p] = static_cast<int64_t>(static_cast<double>(ticks_in[p]) * ns_per_tick());
    assigned += rec.phase_ns[p];
  }
  rec.phase_ns[static_cast<int>(Phase::Other)] = std::max<int64_t>(0, total - assigned);
  return rec;
}

StepProfiler::StepProfiler(size_t history_steps) : capacity_(history_steps) {
  if (history_steps == 0) {
    throw std::invalid_argument(
        "torchspeed.profile.StepProfiler: history_steps must be >= 1, got 0");
  }
  ring_.reserve(std::min<size_t>(history_steps, 4096));
}

void StepProfiler::start() {
  detail::Ring* r = detail::this_thread_ring();
  ring_owner_ = r;
  cursor_ = r ? r->head.load(std::memory_order_acquire) : 0;
  step_begin_ = ticks();
  started_ = true;
}

StepRecord StepProfiler::step(int64_t samples) {
  const uint64_t now = ticks();
  if (!started_) {
    start();
    return StepRecord{};
  }
  events_.clear();
  detail::Ring* r = detail::this_thread_ring();
  if (r != nullptr) {
    // step() on another thread than last time: that thread's events from now on.
    const uint64_t from = r == ring_owner_ ? cursor_ : r->head.load(std::memory_order_acquire);
    cursor_ = r->take(from, &events_);
    ring_owner_ = r;
  }
  StepRecord rec = breakdown(events_, step_begin_, now);
  rec.samples = samples;
  add(rec);
  step_begin_ = now;
  return rec;
}

void StepProfiler::add(const StepRecord& record) {
  if (ring_.size() < capacity_) {
    ring_.push_back(record);
  } else {
    ring_[steps_ % capacity_] = record;
  }
  ++steps_;
}

size_t StepProfiler::steps_dropped() const noexcept {
  return steps_ > capacity_ ? steps_ - capacity_ : 0;
}

std::vector<StepRecord> StepProfiler::history() const {
  if (steps_ <= capacity_) return ring_;
  std::vector<StepRecord> out;
  out.reserve(capacity_);
  for (size_t i = 0; i < capacity_; ++i) out.push_back(ring_[(steps_ + i) % capacity_]);
  return out;
}

namespace {

// Linear-interpolated quantile (numpy's default), as torchspeed.profile.summarize computes it.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = static_cast<double>(v.size() - 1) * q;
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

std::string StepProfiler::summary_table() const {
  const std::vector<StepRecord> h = history();
  std::string out;
  char line[160];
  std::snprintf(line, sizeof(line), "torchspeed step profile: %zu steps (clock %s)\n", h.size(),
                clock_source());
  out += line;
  std::snprintf(line, sizeof(line), "%-10s %12s %12s %8s\n", "phase", "median ms", "p90 ms",
                "share");
  out += line;
  double total = 0;
  std::vector<double> step_ms;
  for (const StepRecord& r : h) {
    step_ms.push_back(static_cast<double>(r.end_ns - r.begin_ns) / 1e6);
    total += step_ms.back();
  }
  for (int p = 0; p < kNumPhases; ++p) {
    std::vector<double> ms;
    double sum = 0;
    for (const StepRecord& r : h) {
      ms.push_back(static_cast<double>(r.phase_ns[p]) / 1e6);
      sum += ms.back();
    }
    std::snprintf(line, sizeof(line), "%-10s %12.3f %12.3f %7.1f%%\n",
                  phase_name(static_cast<Phase>(p)), quantile(ms, 0.5), quantile(ms, 0.9),
                  total > 0 ? 100.0 * sum / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof(line), "%-10s %12.3f %12.3f %7.1f%%\n", "step", quantile(step_ms, 0.5),
                quantile(step_ms, 0.9), total > 0 ? 100.0 : 0.0);
  out += line;
  const uint64_t dropped = dropped_events();
  if (dropped > 0) {
    std::snprintf(line, sizeof(line), "%llu events were overwritten before they were read\n",
                  static_cast<unsigned long long>(dropped));
    out += line;
  }
  return out;
}

}  // namespace torchspeed::profile
