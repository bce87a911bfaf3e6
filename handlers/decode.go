package handlers

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync"
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
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err == nil {
		err = checkNames(body, dst)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(dst)
		if err == nil && !errors.Is(dec.Decode(&struct{}{}), io.EOF) {
			err = errTrailing
		}
	}
	if err == nil {
		return true
	}
	refuse(c, err, limit, "")
	return false
}

// checkNames refuses an object whose names dst's fields do not spell
// exactly, or that repeats a name: encoding/json matches names whatever
// their case and lets the last of a repeated name win, where the API's
// schema allows neither. It also refuses a time field that is no RFC 3339
// string, naming it (the decoder's error does not). What is no object of
// names is left to the decoder to refuse.
func checkNames(raw []byte, dst any) error {
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	names := fieldNames(t)
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		ft, known := names[name]
		switch {
		case !known:
			return fmt.Errorf("json: unknown field %q", name)
		case seen[name]:
			return repeatedError{name}
		}
		seen[name] = true
		var value json.RawMessage
		if dec.Decode(&value) != nil {
			return nil
		}
		if ft == timeType && json.Unmarshal(value, new(time.Time)) != nil {
			return badTimeError{name}
		}
	}
	return nil
}

// timeType is the type of the time fields checkNames checks.
var timeType = reflect.TypeFor[time.Time]()

// fieldNames maps the JSON names of t's fields, embedded structs'
// included, as encoding/json spells them, to their types (pointers
// dereferenced).
func fieldNames(t reflect.Type) map[string]reflect.Type {
	if v, ok := namesOf.Load(t); ok {
		return v.(map[string]reflect.Type)
	}
	names := make(map[string]reflect.Type)
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case name == "" && f.Anonymous && ft.Kind() == reflect.Struct:
			maps.Copy(names, fieldNames(ft))
		case name == "":
			names[f.Name] = ft
		default:
			names[name] = ft
		}
	}
	namesOf.Store(t, names)
	return names
}

// namesOf caches fieldNames by type.
var namesOf sync.Map // reflect.Type → map[string]reflect.Type

// repeatedError refuses an object that names a field twice.
type repeatedError struct{ name string }

func (e repeatedError) Error() string { return "field " + e.name + " given twice" }

// badTimeError refuses a time field that is no RFC 3339 string.
type badTimeError struct{ name string }

func (e badTimeError) Error() string { return e.name + ": want RFC 3339" }

// decodeItems is decode for a JSON array of at most limit bytes, item by
// item, so that a refusal names the item at fault: [i].field.
func decodeItems[T any](c *gin.Context, limit int64) ([]T, bool) {
	var raw []json.RawMessage
	if !decodeUpTo(c, &raw, limit) {
		return nil, false
	}
	out := make([]T, len(raw))
	for i, item := range raw {
		err := checkNames(item, &out[i])
		if err == nil {
			dec := json.NewDecoder(bytes.NewReader(item))
			dec.DisallowUnknownFields()
			err = dec.Decode(&out[i])
		}
		if err != nil {
			refuse(c, err, limit, fmt.Sprintf("[%d]", i))
			return nil, false
		}
	}
	return out, true
}

// refuse writes the 400 or 413 for err, a decoding error of a body of at
// most limit bytes, or of its item at (empty: the body itself).
func refuse(c *gin.Context, err error, limit int64, at string) {
	var (
		tooBig    *http.MaxBytesError
		syntax    *json.SyntaxError
		wrongType *json.UnmarshalTypeError
		badTime   badTimeError
		repeated  repeatedError
	)
	// field names a field of the body, or of its item at.
	field := func(name string) string {
		if at == "" {
			return name
		}
		return at + "." + name
	}
	where := cmp.Or(at, "body")
	switch {
	case errors.As(err, &tooBig):
		fail(c, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body over %d bytes", limit), "")
	case errors.Is(err, errTrailing):
		fail(c, http.StatusBadRequest, "invalid_request", err.Error(), "")
	case errors.As(err, &wrongType) && wrongType.Field == "":
		fail(c, http.StatusBadRequest, "invalid_request", where+": want a JSON "+jsonKind(wrongType.Type), at)
	case errors.As(err, &wrongType):
		f := field(jsonPath(wrongType.Field))
		fail(c, http.StatusBadRequest, "invalid_request", fmt.Sprintf("%s: want a JSON %s", f, jsonKind(wrongType.Type)), f)
	case errors.As(err, &repeated):
		f := field(repeated.name)
		fail(c, http.StatusBadRequest, "invalid_request", "field "+f+" given twice", f)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := field(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
		fail(c, http.StatusBadRequest, "invalid_request", "unknown field "+f, f)
	case errors.As(err, &badTime):
		f := field(badTime.name)
		fail(c, http.StatusBadRequest, "invalid_request", f+": want RFC 3339, e.g. 2026-11-30T12:00:00Z", f)
	case errors.As(err, &syntax), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		fail(c, http.StatusBadRequest, "invalid_request", "body is not valid JSON", "")
	default:
		// Never the decoder's own words: they can quote the value.
		fail(c, http.StatusBadRequest, "invalid_request", where+" does not match the expected fields and types", at)
	}
}

// errTrailing is the answer to a body with more after its JSON object.
var errTrailing = errors.New("body must hold one JSON object, and nothing after it")

// jsonKind names what JSON value decodes into t, in JSON's words rather
// than Go's (the caller sees JSON, not this package's types).
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.String:
		return "string"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		return "array"
	}
	return "object"
}

// jsonPath is the decoder's path to a field as the request spells it:
// encoding/json names an embedded struct by its Go type on the way
// (putKeyRequest.max_concurrent_uses), which the caller never wrote.
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != strings.ToLower(p) {
			continue // a Go type's name: the request's fields are snake_case
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return field
	}
	return strings.Join(out, ".")
}

// invalid writes a 400 naming field.
func invalid(c *gin.Context, field, message string) {
	fail(c, http.StatusBadRequest, "invalid_request", field+": "+message, field)
}
