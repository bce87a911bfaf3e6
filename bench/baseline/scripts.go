package baseline

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libLua string
	//go:embed allocate.lua
	allocateLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed drop.lua
	dropLua string
)

// Each script is lib.lua followed by its own file. redis.Script runs
// EVALSHA and falls back to EVAL when the server lacks the script; it is
// safe for concurrent use.
var (
	allocateScript = redis.NewScript(libLua + allocateLua)
	releaseScript  = redis.NewScript(libLua + releaseLua)
	renewScript    = redis.NewScript(libLua + renewLua)
	dropScript     = redis.NewScript(libLua + dropLua)
)
