package stage

import "time"

// hold passes items from in to out in order, and never keeps in's sender
// waiting on out, so that a group member's callback returns and the pin does
// not expire mid-takeover (docs/scale-out.md, "Code notes"). An item held
// for every is told to the server as in progress, again every every; when
// in is closed, hold hands out what it keeps, then closes out.
func hold(in <-chan item, out chan<- item, every time.Duration) {
	type held struct {
		it    item
		since time.Time
	}
	var q []held
	t := time.NewTicker(every)
	defer t.Stop()
	defer close(out)
	for {
		var send chan<- item
		var next item
		if len(q) > 0 {
			send, next = out, q[0].it
		}
		select {
		case it, ok := <-in:
			if !ok {
				for _, h := range q {
					out <- h.it
				}
				return
			}
			q = append(q, held{it: it, since: time.Now()})
		case send <- next:
			q[0] = held{}
			q = q[1:]
		case now := <-t.C:
			for i := range q {
				if now.Sub(q[i].since) >= every {
					_ = q[i].it.msg.InProgress()
					q[i].since = now
				}
			}
		}
	}
}
