-- Shared by the bench scripts (loaded with dofile): number the threads, count answers per
-- status in each thread, and print one machine-readable line when the run ends (read by
-- bench/loadgen.py).

-- a global: done() reads each thread's copy with thread:get("statuses")
statuses = {}
local registered = {}

function response(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
end

-- wrk calls setup(thread) once per thread, in the main Lua state, before init(): number the
-- threads (init reads thread_no) and keep them for done().
function setup(thread)
   thread:set("thread_no", #registered)
   registered[#registered + 1] = thread
end

function done(summary, latency, requests)
   local total = {}
   for _, thread in ipairs(registered) do
      for status, n in pairs(thread:get("statuses") or {}) do
         total[status] = (total[status] or 0) + n
      end
   end
   local parts = {}
   for status, n in pairs(total) do
      parts[#parts + 1] = string.format('"%d":%d', status, n)
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f},' ..
      '"statuses":{%s}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency.max, latency.mean, table.concat(parts, ",")))
end
