-- datapath.lua: the wrk script of datapath.py: POSTs one JSON body to every
-- target and prints the run's figures as one JSON line for the driver.
--
-- Environment:
--   BENCH_BODY_FILE  file holding the request body (required)
--   BENCH_DELAY_MS   think time per connection between a response and the
--                    next request, in ms (unset: none, closed loop at full
--                    speed)
-- Output (stdout, last line): BENCH_RESULT {"requests":..,"duration_us":..,
--   "bytes":..,"p50_us":..,"p90_us":..,"p99_us":..,"max_us":..,
--   "mean_us":..,"errors":{"connect":..,"read":..,"write":..,
--   "status":..,"timeout":..}}
-- "status" is wrk's count of responses with a status of 400 or more.

local body_file = os.getenv("BENCH_BODY_FILE")
if body_file == nil then
	error("BENCH_BODY_FILE is not set")
end
local f = assert(io.open(body_file, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "")
if delay_ms ~= nil and delay_ms > 0 then
	function delay()
		return delay_ms
	end
end

function done(summary, latency, requests)
	local e = summary.errors
	io.write(string.format(
		'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
		'"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
		'"mean_us":%.1f,"errors":{"connect":%d,"read":%d,' ..
		'"write":%d,"status":%d,"timeout":%d}}\n',
		summary.requests, summary.duration, summary.bytes,
		latency:percentile(50), latency:percentile(90),
		latency:percentile(99), latency.max, latency.mean,
		e.connect, e.read, e.write, e.status, e.timeout))
end
