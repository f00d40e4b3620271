-- wrk script of bin/bench: POST a small JSON body with a unique Idempotency-Key.
-- Arguments (after --): key prefix, and optionally a per-thread response quota after
-- which the thread stops (0 = run for wrk's whole duration).
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function init(args)
  prefix = args[1] or "k"
  quota = tonumber(args[2] or "0")
  counter = 0
  responses = 0
  accepted = 0
  wrk.method = "POST"
  wrk.body = '{"order_id": "A-1001", "total": 250, "customer": {"id": 42, "tier": "gold"}}'
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter
  return wrk.format()
end

function response(status, headers, body)
  responses = responses + 1
  if status == 202 then
    accepted = accepted + 1
  end
  if quota > 0 and responses >= quota then
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local acc = 0
  for _, thread in ipairs(threads) do
    acc = acc + thread:get("accepted")
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "accepted": %d, "duration_us": %d, "connect_errors": %d, '
      .. '"read_errors": %d, "write_errors": %d, "status_errors": %d, "timeouts": %d, '
      .. '"latency_p50_us": %d, "latency_p99_us": %d}\n',
    summary.requests, acc, summary.duration, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99)))
end
