#include "runtime/engine/engine_loop.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace pagedserve {

RequestChannel::RequestChannel(std::function<void()> on_push) : on_push_(std::move(on_push)) {}

void RequestChannel::Push(EngineOutput output) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(output));
  }
  cv_.notify_all();
  if (on_push_) on_push_();
}

std::optional<EngineOutput> RequestChannel::TryPop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return std::nullopt;
  EngineOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

std::optional<EngineOutput> RequestChannel::WaitPop(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoMicroseconds(timeout), [&] { return !queue_.empty(); });
  if (queue_.empty()) return std::nullopt;
  EngineOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

EngineLoop::EngineLoop(Engine* engine, EngineLoopOptions options)
    : engine_(engine), options_(options), config_(engine->scheduler_config()) {
  stats_ = engine_->stats();
}

// `channel` is a sink, moved into channels_ below (clang-tidy 14 does not count
// the std::move as a use).
// NOLINTNEXTLINE(performance-unnecessary-value-param)
absl::Status EngineLoop::Submit(EngineRequest request, std::shared_ptr<RequestChannel> channel) {
  // Thread-safe: reads only what is fixed at Engine::Create.
  engine_->CapDefaultMaxTokens(&request);
  if (absl::Status s = engine_->CheckRequest(request.prompt_token_ids, request.params); !s.ok())
    return s;
  if (absl::Status s = engine_->CheckCacheSalt(request.cache_salt); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return absl::FailedPreconditionError("the engine stopped after a fatal error");
    if (draining_ || (stop_ != nullptr && stop_->load())) {
      return absl::UnavailableError("the server is shutting down; send the request elsewhere");
    }
    if (request.request_id.empty())
      return absl::InvalidArgumentError("request_id must not be empty");
    if (channels_.contains(request.request_id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("request id '", request.request_id, "' is already in flight"));
    }
    const int64_t waiting = stats_.num_waiting + queued_adds_;
    if (waiting >= options_.max_queue_len) {
      return absl::ResourceExhaustedError(absl::StrCat("the waiting queue is full (", waiting,
                                                       " of ", options_.max_queue_len,
                                                       " requests); retry later"));
    }
    channels_.emplace(request.request_id, std::move(channel));
    ++queued_adds_;
    commands_.push_back(Command{false, std::move(request)});
  }
  wake_.notify_one();
  return absl::OkStatus();
}

void EngineLoop::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!channels_.contains(request_id)) return;
    Command c;
    c.abort = true;
    c.request.request_id = request_id;
    commands_.push_back(std::move(c));
  }
  wake_.notify_one();
}

EngineSnapshot EngineLoop::Snapshot() const {
  EngineSnapshot s;
  std::lock_guard<std::mutex> lock(mu_);
  s.scheduler = stats_;
  s.tokens = tokens_;
  s.queued_adds = queued_adds_;
  s.in_flight = static_cast<int64_t>(channels_.size());
  s.kv_blocks_total = config_.num_device_blocks;
  s.kv_blocks_used = std::llround(stats_.device_kv_usage * config_.num_device_blocks);
  s.max_num_seqs = config_.max_num_seqs;
  s.max_model_len = config_.max_model_len;
  s.max_queue_len = options_.max_queue_len;
  s.draining = draining_;
  s.failed = failed_;
  return s;
}

bool EngineLoop::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !draining_ && !(stop_ != nullptr && stop_->load()) && !failed_;
}

void EngineLoop::ApplyCommands(std::vector<Command>& commands) {
  for (Command& c : commands) {
    const std::string id = c.request.request_id;
    if (c.abort) {
      // NotFound: the request already finished in the step before.
      engine_->Abort(id).IgnoreError();
      continue;
    }
    if (absl::Status s = engine_->AddRequest(std::move(c.request)); !s.ok()) {
      // Refused by the engine after Submit's checks (e.g. the id is still
      // held by the scheduler): one final output carrying the error.
      EngineOutput out;
      out.request_id = id;
      out.finished = true;
      out.error = s;
      std::vector<EngineOutput> one;
      one.push_back(std::move(out));
      Deliver(one);
    }
  }
}

void EngineLoop::Deliver(std::vector<EngineOutput>& outputs) {
  for (EngineOutput& out : outputs) {
    std::shared_ptr<RequestChannel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = channels_.find(out.request_id);
      if (it == channels_.end()) continue;
      channel = it->second;
      if (out.finished) channels_.erase(it);
    }
    channel->Push(std::move(out));
  }
}

int64_t EngineLoop::FailAll(const absl::Status& error) {
  std::vector<std::pair<std::shared_ptr<RequestChannel>, EngineOutput>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    for (const auto& [id, channel] : channels_) {
      EngineOutput out;
      out.request_id = id;
      out.finished = true;
      out.error = error;
      failed.emplace_back(channel, std::move(out));
    }
    channels_.clear();
    commands_.clear();
    queued_adds_ = 0;
  }
  for (auto& [channel, out] : failed) channel->Push(std::move(out));
  wake_.notify_all();
  return static_cast<int64_t>(failed.size());
}

void EngineLoop::Publish() {
  const SchedulerStats s = engine_->stats();
  const EngineTokenCounters t = engine_->token_counters();
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = s;
  tokens_ = t;
}

void EngineLoop::AbortAll() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, channel] : channels_) ids.push_back(id);
  }
  for (const std::string& id : ids) engine_->Abort(id).IgnoreError();
}

absl::Status EngineLoop::Run(const std::atomic<bool>& stop, const std::atomic<bool>& abort_now) {
  absl::Time drain_deadline = absl::InfiniteFuture();
  bool draining = false, aborted_all = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = &stop;
  }
  // `stop` may not outlive Run; when Run returns, draining_ or failed_ is set.
  absl::Cleanup forget_stop = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = nullptr;
  };
  while (true) {
    std::vector<Command> commands;
    int64_t in_flight = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop.load() && !draining_) {
        draining_ = true;
        draining = true;
        drain_deadline = absl::Now() + options_.shutdown_grace;
        spdlog::info("engine: shutting down: no new requests; {} in flight (grace {})",
                     channels_.size(), absl::FormatDuration(options_.shutdown_grace));
      }
      if (commands_.empty() && !engine_->HasUnfinishedRequests()) {
        if (draining && channels_.empty()) break;
        wake_.wait_for(lock, absl::ToChronoMicroseconds(options_.idle_wait),
                       [&] { return !commands_.empty() || (stop.load() && !draining_); });
      }
      commands.swap(commands_);
      in_flight = static_cast<int64_t>(channels_.size());
    }
    int64_t adds = 0;
    for (const Command& c : commands) adds += c.abort ? 0 : 1;
    ApplyCommands(commands);
    if (adds > 0) {
      // The adds move from the command queue to the scheduler's waiting
      // queue in one update: Submit's bound always counts them once.
      const SchedulerStats s = engine_->stats();
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = s;
      queued_adds_ -= adds;
    }
    if (draining && !aborted_all && (abort_now.load() || absl::Now() >= drain_deadline)) {
      spdlog::info("engine: aborting {} requests still in flight", in_flight);
      AbortAll();
      aborted_all = true;
    }
    if (!engine_->HasUnfinishedRequests()) {
      Publish();
      continue;
    }
    absl::StatusOr<std::vector<EngineOutput>> outputs = engine_->Step();
    if (!outputs.ok()) {
      spdlog::error("engine: step failed: {}; failing {} requests", outputs.status().ToString(),
                    in_flight);
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = true;
      }
      std::vector<EngineOutput> failed = engine_->FailAll(outputs.status());
      Deliver(failed);
      // Adds queued meanwhile never reached the engine: fail them too.
      std::vector<EngineOutput> late;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, channel] : channels_) {
          EngineOutput& out = late.emplace_back();
          out.request_id = id;
          out.finished = true;
          out.error = outputs.status();
        }
        commands_.clear();
        queued_adds_ = 0;
      }
      Deliver(late);
      Publish();
      return outputs.status();
    }
    // Stats first: a client that reacts to an output (e.g. sends the next
    // request once its first one streams) must see the queue as it is after
    // this step, not before it (Submit's bound reads stats_).
    Publish();
    Deliver(*outputs);
  }
  Publish();
  spdlog::info("engine: drained");
  return absl::OkStatus();
}

}  // namespace pagedserve
