-- wrk script for bench/tracker_load.py: announces spread over many torrents and peers.
-- WS_HASHES: file with one hex infohash per line; WS_PEERS: number of distinct peers;
-- WS_ANNOUNCE_PATH: the announce path (default /announce; weightswarm's is /announce/<passkey>).
local function pct(hex)
  return (hex:gsub("..", function(b) return "%" .. b end))
end

local hashes, peer_ids = {}, {}
local path = os.getenv("WS_HASHES")
for line in io.lines(path) do
  if #line == 40 then hashes[#hashes + 1] = pct(line) end
end
local npeers = tonumber(os.getenv("WS_PEERS") or "1000")
local announce_path = os.getenv("WS_ANNOUNCE_PATH") or "/announce"
for i = 1, npeers do
  peer_ids[i] = pct(string.format("2d5753303130302d%024x", i))  -- "-WS0100-" + 12 bytes
end

local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end

function init(args)
  math.randomseed(os.time() + (id or 0) * 7919)
end

request = function()
  local h = hashes[math.random(#hashes)]
  local p = math.random(npeers)
  local left = (p % 5 == 0) and "0" or "1048576"  -- a fifth of the peers are seeders
  local path = announce_path .. "?info_hash=" .. h .. "&peer_id=" .. peer_ids[p] .. "&port=" .. (10000 + p) ..
    "&uploaded=0&downloaded=0&left=" .. left .. "&compact=1&numwant=50"
  return wrk.format("GET", path)
end

done = function(summary, latency, requests)
  io.write(string.format(
    "WSRESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d status_errors=%d " ..
    "socket_errors=%d timeouts=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write, summary.errors.timeout))
end
