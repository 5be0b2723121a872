// Chrome trace event JSON (the format Perfetto and chrome://tracing read) from the rings and the
// steps of a StepProfiler: "X" (complete) events in microseconds with nanosecond decimals.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/atomic_file.h"
#include "core/utf8.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::profile {
namespace {

// A JSON string literal: invalid UTF-8 shown as \xNN text, quotes, backslashes and control
// characters escaped.
void json_string(std::string* out, std::string_view s) {
  const std::string text = escape_invalid_utf8(s);
  out->push_back('"');
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(ch);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else {
      out->push_back(ch);
    }
  }
  out->push_back('"');
}

// Nanoseconds as microseconds with three decimals, in integer arithmetic (no locale, no rounding).
void json_us(std::string* out, int64_t ns) {
  char buf[40];
  const char* sign = ns < 0 ? "-" : "";
  const uint64_t a = ns < 0 ? static_cast<uint64_t>(-(ns + 1)) + 1 : static_cast<uint64_t>(ns);
  std::snprintf(buf, sizeof(buf), "%s%llu.%03llu", sign, static_cast<unsigned long long>(a / 1000),
                static_cast<unsigned long long>(a % 1000));
  *out += buf;
}

}  // namespace

void write_chrome_trace(const std::string& path, const StepProfiler* profiler,
                        const std::vector<std::pair<uint64_t, std::string>>& thread_names) {
  std::vector<ThreadEvents> threads = snapshot();
  for (const auto& [tid, tname] : thread_names) {
    for (ThreadEvents& te : threads) {
      if (te.os_tid == tid) te.thread_name = tname;
    }
  }
  const long pid = static_cast<long>(getpid());
  std::unordered_map<NameId, std::string> names;  // name_of() once per id
  const auto name = [&](NameId id) -> const std::string& {
    auto it = names.find(id);
    if (it == names.end()) {
      std::string text;
      try {
        text = name_of(id);
      } catch (const std::out_of_range&) {
        text = "?";
      }
      it = names.emplace(id, std::move(text)).first;
    }
    return it->second;
  };
  std::string out;
  out.reserve(1 << 20);
  out += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  const auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  const auto meta = [&](uint64_t tid, const char* key, std::string_view value) {
    sep();
    out += "{\"ph\":\"M\",\"name\":\"";
    out += key;
    out += "\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
           ",\"args\":{\"name\":";
    json_string(&out, value);
    out += "}}";
  };
  meta(0, "process_name", "torchspeed");
  uint64_t async_id = 0;
  for (const ThreadEvents& te : threads) {
    meta(te.os_tid, "thread_name",
         te.thread_name.empty() ? "thread " + std::to_string(te.os_tid) : te.thread_name);
    // Perfetto needs the complete ("X") events of one track to nest. Ranges that overlap an
    // enclosing one only partly (async code interleaving two ranges on one thread) become
    // async "b"/"e" pairs instead, which have tracks of their own.
    std::vector<size_t> order(te.events.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const Event &a = te.events[x], &b = te.events[y];
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<uint64_t> open_ends;
    for (const size_t i : order) {
      const Event& ev = te.events[i];
      while (!open_ends.empty() && open_ends.back() <= ev.begin) open_ends.pop_back();
      const bool nested = open_ends.empty() || ev.end <= open_ends.back();
      if (nested) open_ends.push_back(ev.end);
      const int64_t b = ticks_to_ns(ev.begin), e = ticks_to_ns(ev.end);
      const std::string common =
          ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(te.os_tid);
      std::string head = "\"name\":";
      json_string(&head, name(ev.name));
      head += ",\"cat\":\"";
      head += ev.phase == Phase::None ? "range" : phase_name(ev.phase);
      head += "\"";
      sep();
      if (nested) {
        out += "{\"ph\":\"X\"," + head + ",\"ts\":";
        json_us(&out, b);
        out += ",\"dur\":";
        json_us(&out, e > b ? e - b : 0);
        out += common + "}";
      } else {
        const std::string id = ",\"id\":" + std::to_string(++async_id);
        out += "{\"ph\":\"b\"," + head + id + ",\"ts\":";
        json_us(&out, b);
        out += common + "},\n{\"ph\":\"e\"," + head + id + ",\"ts\":";
        json_us(&out, e);
        out += common + "}";
      }
    }
  }
  if (profiler != nullptr) {
    // Steps on a track of their own (tid 0): ranges that cross a step boundary would otherwise
    // break the nesting Perfetto requires on one thread's track.
    meta(0, "thread_name", "torchspeed steps");
    const std::vector<StepRecord> steps = profiler->history();
    size_t index = profiler->steps_dropped();
    for (const StepRecord& s : steps) {
      sep();
      out +=
          "{\"ph\":\"X\",\"name\":\"step " + std::to_string(index) + "\",\"cat\":\"step\",\"ts\":";
      json_us(&out, s.begin_ns);
      out += ",\"dur\":";
      json_us(&out, s.end_ns - s.begin_ns);
      out += ",\"pid\":" + std::to_string(pid) +
             ",\"tid\":0,\"args\":{\"step\":" + std::to_string(index);
      for (int p = 0; p < kNumPhases; ++p) {
        out += ",\"";
        out += phase_name(static_cast<Phase>(p));
        out += "_us\":";
        json_us(&out, s.phase_ns[p]);
      }
      out += ",\"samples\":" + std::to_string(s.samples) + "}}";
      ++index;
    }
  }
  out += "\n],\"otherData\":{\"producer\":\"torchspeed.profile\",\"clock\":\"";
  out += clock_source();
  out += "\",\"clock_domain\":\"CLOCK_MONOTONIC\",\"dropped_events\":" +
         std::to_string(dropped_events()) + "}}\n";
  // Written beside the target and renamed over it: a reader never sees half a trace, and a
  // device node or FIFO at `path` is refused rather than replaced.
  torchspeed::atomic_write_file(path, out, "torchspeed.profile.export_chrome_trace");
}

}  // namespace torchspeed::profile
