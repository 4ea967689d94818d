package service

import (
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Large answers. nats-server stalls a connection that publishes to a
// client whose outbound buffer is three quarters full (a client that does
// not read its answers): it reads that connection's next bytes only after a
// few milliseconds. Pages of up to a MiB asked by such a client, sent on the
// connection every answer goes out on, held every smaller answer behind them
// in the socket and in nats.go's buffer, and held the endpoint's callback,
// which sends a reused answer itself, while nats.go wrote them. So answers
// over LargeAnswer bytes are queued for a sender of their own, on a
// connection of their own (Config.LargeConn): a stalled large write delays
// only other large answers. The queue is bounded, in all and for each asker
// (the connection a reply inbox belongs to): an answer that would exceed
// either bound is not queued, and its asker gets a 503 instead, queued for
// the same sender (or, when even that queue is full, nothing).
const (
	// LargeAnswer is the size in bytes over which an answer is sent by the
	// large answers' sender.
	LargeAnswer = 64 << 10
	// LargeQueueBytes bounds the bytes of large answers queued for sending.
	LargeQueueBytes = 64 << 20
	// LargeQueuePerAsker bounds the bytes of large answers queued for one
	// asker: a few pages of a MiB.
	LargeQueuePerAsker = 8 << 20
)

// largeAnswer is an answer queued for the large answers' sender; sent hears
// how its publish went.
type largeAnswer struct {
	msg   *nats.Msg
	asker string
	sent  func(err error)
}

// largeSender sends large answers, one at a time, in the order queued.
type largeSender struct {
	conn  *nats.Conn
	queue chan largeAnswer
	done  sync.WaitGroup

	mu     sync.Mutex
	closed bool
	bytes  int            // queued, in all
	asked  map[string]int // queued, by asker
}

func newLargeSender(conn *nats.Conn) *largeSender {
	l := &largeSender{conn: conn, queue: make(chan largeAnswer, 2*LargeQueueBytes/LargeAnswer), asked: map[string]int{}}
	l.done.Go(l.run)
	return l
}

// asker is what a reply subject says of the connection that waits for it:
// the inbox prefix before its last token, which nats.go and the other
// clients keep for every request of a connection.
func asker(reply string) string {
	if i := strings.LastIndexByte(reply, '.'); i > 0 {
		return reply[:i]
	}
	return reply
}

// offer queues a large answer, or reports false when either bound would be
// exceeded. After close, it sends the answer at once.
func (l *largeSender) offer(msg *nats.Msg, sent func(err error)) bool {
	n, who := len(msg.Data), asker(msg.Subject)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		sent(l.conn.PublishMsg(msg))
		return true
	}
	if l.bytes+n > LargeQueueBytes || l.asked[who]+n > LargeQueuePerAsker {
		l.mu.Unlock()
		return false
	}
	select {
	case l.queue <- largeAnswer{msg: msg, asker: who, sent: sent}:
		l.bytes += n
		l.asked[who] += n
		l.mu.Unlock()
		return true
	default: // as many refusals as large answers queued
		l.mu.Unlock()
		return false
	}
}

// refuse queues the refusal of a large answer behind the large answers its
// asker has not taken: sent on the large answers' connection, it cannot
// stall the answering one, which nats-server would do for a client whose
// outbound buffer is nearly full. It reports false when the queue has no
// room, and the refusal is not sent.
func (l *largeSender) refuse(msg *nats.Msg, sent func(err error)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	select {
	case l.queue <- largeAnswer{msg: msg, asker: asker(msg.Subject), sent: sent}:
		return true
	default:
		return false
	}
}

func (l *largeSender) run() {
	for a := range l.queue {
		err := l.conn.PublishMsg(a.msg)
		n := len(a.msg.Data)
		l.mu.Lock()
		l.bytes -= n
		if l.asked[a.asker] -= n; l.asked[a.asker] <= 0 {
			delete(l.asked, a.asker)
		}
		l.mu.Unlock()
		a.sent(err)
	}
}

// close sends what is queued and returns once it is sent; an answer offered
// later is sent at once.
func (l *largeSender) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	l.done.Wait()
}
