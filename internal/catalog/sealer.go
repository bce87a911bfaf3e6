package catalog

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// sealedPrefix starts every sealed secret: "v1:<key tag>:<base64 of nonce
// and ciphertext>". A stored secret without it is plaintext, as written
// before sealing existed; Rekey seals it.
const sealedPrefix = "v1:"

// Sealer encrypts secrets at rest with AES-256-GCM. It seals with its
// current key and opens with any of its keys, so that keys can be rotated
// (see Rekey). Each secret is bound to its key id, so a sealed value moved
// to another row does not open. It is safe for concurrent use.
type Sealer struct {
	current string                 // tag of the key that seals
	keys    map[string]cipher.AEAD // by tag: the first 8 bytes of SHA-256(key), hex
}

// NewSealer returns a Sealer that seals with current and opens with
// current and old, each 32 bytes.
func NewSealer(current []byte, old ...[]byte) (*Sealer, error) {
	s := &Sealer{keys: map[string]cipher.AEAD{}}
	for i, k := range append([][]byte{current}, old...) {
		if len(k) != 32 {
			return nil, fmt.Errorf("catalog: secret key %d is %d bytes, want 32", i+1, len(k))
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("catalog: secret key %d: %w", i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("catalog: secret key %d: %w", i+1, err)
		}
		sum := sha256.Sum256(k)
		tag := hex.EncodeToString(sum[:8])
		if i == 0 {
			s.current = tag
		}
		s.keys[tag] = aead
	}
	return s, nil
}

// ParseSealer reads keys as base64 of 32 bytes (e.g. from openssl rand
// -base64 32): current, and old as a comma-separated list (may be empty).
// Errors never quote the keys.
func ParseSealer(current, old string) (*Sealer, error) {
	decode := func(s string) ([]byte, error) {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
		if err != nil {
			return nil, errors.New("catalog: secret key is not base64")
		}
		return b, nil
	}
	cur, err := decode(current)
	if err != nil {
		return nil, err
	}
	var olds [][]byte
	for _, o := range strings.Split(old, ",") {
		if strings.TrimSpace(o) == "" {
			continue
		}
		b, err := decode(o)
		if err != nil {
			return nil, err
		}
		olds = append(olds, b)
	}
	return NewSealer(cur, olds...)
}

// NewSealerKey returns a fresh random sealing key, base64, for ParseSealer.
func NewSealerKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// seal encrypts plain, the secret of key id, with the current key.
func (s *Sealer) seal(id, plain string) (string, error) {
	aead := s.keys[s.current]
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := aead.Seal(nonce, nonce, []byte(plain), []byte(id))
	return sealedPrefix + s.current + ":" + base64.StdEncoding.EncodeToString(out), nil
}

// open decrypts stored, the secret of key id; plaintext passes as is.
func (s *Sealer) open(id, stored string) (string, error) {
	rest, ok := strings.CutPrefix(stored, sealedPrefix)
	if !ok {
		return stored, nil
	}
	tag, b64, ok := strings.Cut(rest, ":")
	aead := s.keys[tag]
	if !ok || aead == nil {
		// The tag is quoted only if it is one: a plaintext secret from
		// before sealing that merely starts like a sealed one must not be.
		if !isTag(tag) {
			tag = "not a key tag"
		}
		return "", fmt.Errorf("%w: key %s: sealed with a key this process does not have (%s)", ErrSecret, id, tag)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < aead.NonceSize() {
		return "", fmt.Errorf("%w: key %s: malformed", ErrSecret, id)
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(id))
	if err != nil {
		return "", fmt.Errorf("%w: key %s: tampered, or moved from another key", ErrSecret, id)
	}
	return string(plain), nil
}

// fresh reports whether stored is sealed with the current key.
func (s *Sealer) fresh(stored string) bool {
	return strings.HasPrefix(stored, sealedPrefix+s.current+":")
}

// foreign reports whether stored holds sealed secrets and not one of them
// names a key s has: s was given the wrong keys. It compares key tags
// only; plaintext secrets say nothing either way.
func (s *Sealer) foreign(stored []storedSecret) bool {
	others := false
	for _, r := range stored {
		rest, ok := strings.CutPrefix(r.secret, sealedPrefix)
		tag, _, _ := strings.Cut(rest, ":")
		switch {
		case !ok || !isTag(tag):
		case s.keys[tag] != nil:
			return false
		default:
			others = true
		}
	}
	return others
}

// isTag reports whether tag has the form of a key tag: 16 lowercase hex
// digits.
func isTag(tag string) bool {
	return len(tag) == 16 && strings.Trim(tag, "0123456789abcdef") == ""
}
