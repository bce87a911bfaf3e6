package handlers

// StatusFor is statusFor, for the tests of package handlers_test.
var StatusFor = statusFor

// MappedErrors are the errors statusFor maps, in its order.
func MappedErrors() []error {
	out := make([]error, len(errorCodes))
	for i, e := range errorCodes {
		out[i] = e.err
	}
	return out
}
