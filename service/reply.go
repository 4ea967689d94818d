package service

import (
	"log/slog"

	"github.com/nats-io/nats.go/micro"
)

// refuseReply counts and logs a request left unanswered for its reply
// subject; the log line at most once a minute a subject (the asker's, when
// the verb is addressed), so that a flood of them cannot flood the log.
func (s *Service) refuseReply(r micro.Request, count *counters) {
	count.refusedReplies.Add(1)
	s.warnings.Log(slog.LevelWarn, "refused reply", r.Subject(), "request not answered: its reply subject is not an inbox the service answers to",
		"reply", r.Reply(), "subject", r.Subject(), "refused_replies", count.refusedReplies.Load())
}
