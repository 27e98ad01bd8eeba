package redis

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// redisLog writes go-redis's own lines to a store's logger. go-redis has
// one logger per process (redis.SetLogger, and its lines carry no trace of
// the client they are about), so each store sets it to one that writes to
// its own logger: the latest store made gets them, and that setter is the
// only global.
type redisLog struct{ log *slog.Logger }

func installLog(log *slog.Logger) { goredis.SetLogger(redisLog{log}) }

// Printf implements go-redis's logger. A failed dial is at debug level:
// the call that needed the connection fails with the same cause, and its
// caller reports it. Other lines (the pool's own troubles) reach no
// caller, so they are warnings.
func (l redisLog) Printf(ctx context.Context, format string, args ...any) {
	line := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, args...), "redis: "))
	level := slog.LevelWarn
	if strings.Contains(line, "failed to dial") {
		level = slog.LevelDebug
	}
	l.log.Log(ctx, level, "redis client", "line", line)
}
