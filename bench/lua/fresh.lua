-- A new transfer per request: a key never used before (run token, a random prefix per
-- thread, the thread number and a counter) and a random pair of the bench accounts.
-- args: PATH API_KEY PAIRS ACCOUNT_PREFIX RUN_TOKEN

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local path, pairs_n, account_prefix, key_prefix
local headers = {}
local counter = 0

function init(args)
   path = args[1]
   pairs_n = tonumber(args[3])
   account_prefix = args[4]
   math.randomseed(os.time() * 1000 + (thread_no or 0))
   key_prefix = string.format("%s-%06x%06x-%d",
      args[5], math.random(0, 0xffffff), math.random(0, 0xffffff), thread_no or 0)
   headers["Authorization"] = "Bearer " .. args[2]
   headers["Content-Type"] = "application/json"
end

function request()
   counter = counter + 1
   local p = math.random(1, pairs_n)
   headers["Idempotency-Key"] = key_prefix .. "-" .. counter
   local body = string.format(
      '{"source":"%s%012d","destination":"%s%012d","amount":1,"currency":"EUR"}',
      account_prefix, 2 * p - 1, account_prefix, 2 * p)
   return wrk.format("POST", path, headers, body)
end
