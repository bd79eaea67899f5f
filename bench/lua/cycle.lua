-- Cycles through pre-built raw HTTP requests.
-- args: FILE, a list of requests, each written as "<byte length>\n<request bytes>".
-- Each thread starts at another place in the list.

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local requests = {}
local index = 0

function init(args)
   local f = assert(io.open(args[1], "rb"))
   local data = f:read("*a")
   f:close()
   local pos = 1
   while pos <= #data do
      local newline = data:find("\n", pos, true)
      local length = tonumber(data:sub(pos, newline - 1))
      requests[#requests + 1] = data:sub(newline + 1, newline + length)
      pos = newline + length + 1
   end
   index = ((thread_no or 0) * 7919) % #requests
end

function request()
   index = index % #requests + 1
   return requests[index]
end
