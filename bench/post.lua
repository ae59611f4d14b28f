-- wrk: POST one AdmissionReview body (file named by BODY) and report latency percentiles as JSON.
local f = assert(io.open(os.getenv("BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
