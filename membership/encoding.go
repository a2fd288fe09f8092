package membership

import (
	"encoding/json"
	"fmt"
	"time"
)

// An event with the time it happened, as one entry of a replicated log:
// every replica that decodes the same entries in the same order Steps its
// Machine to the same state (the time travels with the event, so no
// replica reads its own clock).

type entry struct {
	Kind string          `json:"k"`
	At   time.Time       `json:"at"`
	Ev   json.RawMessage `json:"ev"`
}

// Encode returns ev at time at as bytes for a replicated log.
func Encode(at time.Time, ev Event) ([]byte, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	kind := kindOf(ev)
	if kind == "" {
		return nil, fmt.Errorf("membership: can not encode event %T", ev)
	}
	return json.Marshal(entry{Kind: kind, At: at, Ev: b})
}

// Decode returns the event and its time that Encode gave b.
func Decode(b []byte) (time.Time, Event, error) {
	var e entry
	if err := json.Unmarshal(b, &e); err != nil {
		return time.Time{}, nil, fmt.Errorf("membership: bad log entry: %w", err)
	}
	var ev Event
	var err error
	switch e.Kind {
	case "register":
		ev, err = decodeAs[Register](e.Ev)
	case "ack":
		ev, err = decodeAs[Ack](e.Ev)
	case "disconnected":
		ev, err = decodeAs[Disconnected](e.Ev)
	case "leave":
		ev, err = decodeAs[Leave](e.Ev)
	case "leaving":
		ev, err = decodeAs[Leaving](e.Ev)
	case "late":
		ev, err = decodeAs[Late](e.Ev)
	case "abort":
		ev, err = decodeAs[AbortRequest](e.Ev)
	case "link-failed":
		ev, err = decodeAs[LinkFailed](e.Ev)
	case "link-check":
		ev, err = decodeAs[LinkCheck](e.Ev)
	case "grow":
		ev, err = decodeAs[Grow](e.Ev)
	case "wait-tick":
		ev, err = decodeAs[WaitTick](e.Ev)
	case "wait-expired":
		ev, err = decodeAs[WaitExpired](e.Ev)
	default:
		return time.Time{}, nil, fmt.Errorf("membership: log entry of unknown kind %q", e.Kind)
	}
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("membership: bad %s entry: %w", e.Kind, err)
	}
	return e.At, ev, nil
}

func decodeAs[T Event](b []byte) (Event, error) {
	var ev T
	err := json.Unmarshal(b, &ev)
	return ev, err
}

func kindOf(ev Event) string {
	switch ev.(type) {
	case Register:
		return "register"
	case Ack:
		return "ack"
	case Disconnected:
		return "disconnected"
	case Leave:
		return "leave"
	case Leaving:
		return "leaving"
	case Late:
		return "late"
	case AbortRequest:
		return "abort"
	case LinkFailed:
		return "link-failed"
	case LinkCheck:
		return "link-check"
	case Grow:
		return "grow"
	case WaitTick:
		return "wait-tick"
	case WaitExpired:
		return "wait-expired"
	}
	return ""
}
