package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// Status is a response status (contract §5).
type Status uint16

// Statuses of contract §5.
const (
	StatusOK       Status = contract.RegistryStatusOK
	StatusRetry    Status = contract.RegistryStatusRetry
	StatusNotFound Status = contract.RegistryStatusNotFound
	StatusDenied   Status = contract.RegistryStatusDenied
	StatusInvalid  Status = contract.RegistryStatusInvalid
	StatusBusy     Status = contract.RegistryStatusBusy
	StatusInternal Status = contract.RegistryStatusInternal
)

var statusNames = [...]string{"OK", "RETRY", "NOT_FOUND", "DENIED", "INVALID", "BUSY", "INTERNAL"}

// String is the status's name in contract §5 (also the metric label), or "STATUS_<n>".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("STATUS_%d", uint16(s))
}

// Header is a decoded frame header.
type Header struct {
	Kind   uint8
	Length uint32
}

// Request is a Register request (kind 1). Empty strings are absent fields.
type Request struct {
	PodUID        string
	ContainerName string
	RegisterUUID  string
	ClientVersion string
}

// PerClaim reports whether the request selects the per-claim path (a non-empty tag 3).
func (r Request) PerClaim() bool { return r.RegisterUUID != "" }

// Response is a Register response (kind 2).
type Response struct {
	Status  Status
	Message string
	// RetryAfter is retry_after_ms; meaningful only when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
}

// FrameError says which rule of contract §5 a frame breaks; the server answers INVALID.
type FrameError struct{ Reason string }

func (e *FrameError) Error() string { return "invalid registry frame: " + e.Reason }

// ErrInvalidFrame matches every *FrameError with errors.Is.
var ErrInvalidFrame = errors.New("invalid registry frame")

// Is makes errors.Is(err, ErrInvalidFrame) true for frame errors.
func (e *FrameError) Is(target error) bool { return target == ErrInvalidFrame }

func invalid(format string, args ...any) error {
	return &FrameError{Reason: fmt.Sprintf(format, args...)}
}

// ParseHeader decodes and checks the 12-byte header: magic, version 1, reserved 0 and a
// length of at most 4096. The kind is returned as it is; callers check it.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < contract.RegistryHeaderLen {
		return Header{}, invalid("header is %d bytes, want %d", len(b), contract.RegistryHeaderLen)
	}
	if string(b[0:4]) != contract.RegistryMagic {
		return Header{}, invalid("bad magic %q", b[0:4])
	}
	if b[4] != contract.RegistryVersion {
		return Header{}, invalid("version %d, want %d", b[4], contract.RegistryVersion)
	}
	if r := binary.BigEndian.Uint16(b[6:8]); r != 0 {
		return Header{}, invalid("reserved is %d, want 0", r)
	}
	n := binary.BigEndian.Uint32(b[8:12])
	if n > contract.RegistryMaxBody {
		return Header{}, invalid("body length %d exceeds %d", n, contract.RegistryMaxBody)
	}
	return Header{Kind: b[5], Length: n}, nil
}

// field is one decoded tag-length-value.
type field struct {
	tag   uint8
	value []byte
}

// parseFields splits a field list, checking every length before it is used and refusing a
// repeated tag (known or not: contract §5 makes any repetition INVALID).
func parseFields(b []byte, visit func(field) error) error {
	var seen [256]bool
	for off := 0; off < len(b); {
		if len(b)-off < 3 {
			return invalid("truncated field header at offset %d", off)
		}
		tag := b[off]
		n := int(binary.BigEndian.Uint16(b[off+1 : off+3]))
		off += 3
		if n > len(b)-off {
			return invalid("field %d declares %d bytes, %d left", tag, n, len(b)-off)
		}
		if seen[tag] {
			return invalid("repeated tag %d", tag)
		}
		seen[tag] = true
		if err := visit(field{tag: tag, value: b[off : off+n]}); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// ParseRequest decodes and validates a request body. Unknown tags are skipped. An empty
// optional field is the same as an absent one.
func ParseRequest(body []byte) (Request, error) {
	var r Request
	err := parseFields(body, func(f field) error {
		switch f.tag {
		case contract.RegistryTagPodUID:
			r.PodUID = string(f.value)
		case contract.RegistryTagContainerName:
			r.ContainerName = string(f.value)
		case contract.RegistryTagRegisterUUID:
			r.RegisterUUID = string(f.value)
		case contract.RegistryTagClientVersion:
			if len(f.value) > contract.RegistryMaxClientVersion {
				return invalid("client_version is %d bytes, at most %d", len(f.value), contract.RegistryMaxClientVersion)
			}
			r.ClientVersion = string(f.value)
		}
		return nil
	})
	if err != nil {
		return Request{}, err
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// Validate checks the field rules of contract §5: NRI path needs pod_uid and
// container_name; per-claim path needs register_uuid; every UUID is canonical lower-case
// and container_name is a DNS label.
func (r Request) Validate() error {
	if len(r.ClientVersion) > contract.RegistryMaxClientVersion {
		return invalid("client_version is %d bytes, at most %d", len(r.ClientVersion), contract.RegistryMaxClientVersion)
	}
	if !r.PerClaim() && (r.PodUID == "" || r.ContainerName == "") {
		return invalid("pod_uid and container_name are required without register_uuid")
	}
	for _, u := range []struct{ what, v string }{{"register_uuid", r.RegisterUUID}, {"pod_uid", r.PodUID}} {
		if u.v == "" {
			continue
		}
		if err := contract.ValidateUID(u.v); err != nil {
			return invalid("%s: %v", u.what, err)
		}
	}
	if r.ContainerName != "" {
		if err := contract.ValidateContainerName(r.ContainerName); err != nil {
			return invalid("container_name: %v", err)
		}
	}
	return nil
}

// ParseResponse decodes a response body: status, then fields. A message that is not UTF-8
// or longer than 1024 bytes, or a retry_after_ms that is not 4 bytes, is invalid.
func ParseResponse(body []byte) (Response, error) {
	if len(body) < 2 {
		return Response{}, invalid("response body is %d bytes, want at least 2", len(body))
	}
	r := Response{Status: Status(binary.BigEndian.Uint16(body[0:2]))}
	err := parseFields(body[2:], func(f field) error {
		switch f.tag {
		case contract.RegistryTagMessage:
			if len(f.value) > contract.RegistryMaxMessage || !utf8.Valid(f.value) {
				return invalid("message is not UTF-8 of at most %d bytes", contract.RegistryMaxMessage)
			}
			r.Message = string(f.value)
		case contract.RegistryTagRetryAfterMS:
			if len(f.value) != 4 {
				return invalid("retry_after_ms is %d bytes, want 4", len(f.value))
			}
			r.HasRetryAfter = true
			r.RetryAfter = time.Duration(binary.BigEndian.Uint32(f.value)) * time.Millisecond
		}
		return nil
	})
	if err != nil {
		return Response{}, err
	}
	return r, nil
}

// ParseFrame decodes one whole frame from the start of b: the header, then a request or a
// response body by its kind. Bytes after the frame are ignored (contract §5). It is the
// parser the fuzz target drives; the server reads header and body separately with the same
// functions.
func ParseFrame(b []byte) (Header, any, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return Header{}, nil, err
	}
	end := contract.RegistryHeaderLen + int(h.Length)
	if len(b) < end {
		return h, nil, invalid("frame truncated: %d of %d body bytes", len(b)-contract.RegistryHeaderLen, h.Length)
	}
	body := b[contract.RegistryHeaderLen:end]
	switch h.Kind {
	case contract.RegistryKindRequest:
		r, err := ParseRequest(body)
		return h, r, err
	case contract.RegistryKindResponse:
		r, err := ParseResponse(body)
		return h, r, err
	default:
		return h, nil, invalid("unknown kind %d", h.Kind)
	}
}

func appendHeader(dst []byte, kind uint8, length int) []byte {
	dst = append(dst, contract.RegistryMagic...)
	dst = append(dst, contract.RegistryVersion, kind, 0, 0)
	return binary.BigEndian.AppendUint32(dst, uint32(length))
}

func appendField(dst []byte, tag uint8, value []byte) []byte {
	dst = append(dst, tag)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(value)))
	return append(dst, value...)
}

// AppendRequest appends r as a whole request frame. Empty fields are omitted. It refuses a
// request that breaks the field rules, so a valid frame is all it can produce.
func AppendRequest(dst []byte, r Request) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return dst, err
	}
	var body []byte
	for _, f := range []struct {
		tag uint8
		v   string
	}{
		{contract.RegistryTagPodUID, r.PodUID},
		{contract.RegistryTagContainerName, r.ContainerName},
		{contract.RegistryTagRegisterUUID, r.RegisterUUID},
		{contract.RegistryTagClientVersion, r.ClientVersion},
	} {
		if f.v != "" {
			body = appendField(body, f.tag, []byte(f.v))
		}
	}
	dst = appendHeader(dst, contract.RegistryKindRequest, len(body))
	return append(dst, body...), nil
}

// AppendResponse appends r as a whole response frame. The message is cut to 1024 bytes at a
// rune boundary (invalid UTF-8 is replaced); retry_after_ms is written when HasRetryAfter.
func AppendResponse(dst []byte, r Response) []byte {
	msg := clipMessage(r.Message)
	body := binary.BigEndian.AppendUint16(nil, uint16(r.Status))
	if msg != "" {
		body = appendField(body, contract.RegistryTagMessage, []byte(msg))
	}
	if r.HasRetryAfter {
		ms := r.RetryAfter.Milliseconds()
		if ms < 0 {
			ms = 0
		} else if ms > int64(^uint32(0)) {
			ms = int64(^uint32(0))
		}
		body = appendField(body, contract.RegistryTagRetryAfterMS, binary.BigEndian.AppendUint32(nil, uint32(ms)))
	}
	dst = appendHeader(dst, contract.RegistryKindResponse, len(body))
	return append(dst, body...)
}

// clipMessage makes s valid UTF-8 of at most RegistryMaxMessage bytes.
func clipMessage(s string) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // replaces invalid bytes with U+FFFD
	}
	if len(s) <= contract.RegistryMaxMessage {
		return s
	}
	cut := contract.RegistryMaxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
