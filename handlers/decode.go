package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
)

// maxBody bounds every request body but a bulk put's (maxBulkBody).
const maxBody = 64 << 10

// decode reads one JSON object into dst, rejecting unknown fields, bodies
// over maxBody and trailing data. On failure it has written the 400 or 413
// and returns false; the message names a field or type, never a value the
// request carried (a secret pasted into the wrong field must not come back).
func decode(c *gin.Context, dst any) bool { return decodeUpTo(c, dst, maxBody) }

// decodeUpTo is decode for bodies of at most limit bytes.
func decodeUpTo(c *gin.Context, dst any, limit int64) bool {
	dec := json.NewDecoder(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil && !errors.Is(dec.Decode(&struct{}{}), io.EOF) {
		err = errors.New("body must hold one JSON object")
	}
	if err == nil {
		return true
	}
	var (
		tooBig    *http.MaxBytesError
		syntax    *json.SyntaxError
		wrongType *json.UnmarshalTypeError
		badTime   *time.ParseError
	)
	switch {
	case errors.As(err, &tooBig):
		fail(c, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body over %d bytes", limit), "")
	case errors.As(err, &wrongType):
		fail(c, http.StatusBadRequest, "invalid_request", fmt.Sprintf("%s: want a JSON %s", wrongType.Field, wrongType.Type), wrongType.Field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		fail(c, http.StatusBadRequest, "invalid_request", "unknown field "+field, field)
	case errors.As(err, &badTime):
		fail(c, http.StatusBadRequest, "invalid_request", "a time field: want RFC 3339, e.g. 2026-11-30T12:00:00Z", "")
	case errors.As(err, &syntax), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		fail(c, http.StatusBadRequest, "invalid_request", "body is not valid JSON", "")
	default:
		// Never the decoder's own words: they can quote the value.
		fail(c, http.StatusBadRequest, "invalid_request", "body does not match the expected fields and types", "")
	}
	return false
}

// invalid writes a 400 naming field.
func invalid(c *gin.Context, field, message string) {
	fail(c, http.StatusBadRequest, "invalid_request", field+": "+message, field)
}
