// Package redact keeps the passwords of the URLs a user gives (--state,
// --sink, push endpoints) out of log lines and error messages: every
// command and store masks them through here.
package redact

import (
	"errors"
	"log/slog"
	"net/url"
	"regexp"
)

// Mask is what a password is replaced with.
const Mask = "xxxxx"

// userinfo matches scheme://user:password@, the password up to the last @
// before the host, as net/url reads it; it also finds URLs net/url
// refuses, such as one with a bad port, which its errors quote whole.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s"']*):[^/?#\s"']*@`)

// URL is rawURL with its password masked, for a log line or a label.
func URL(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return u.Redacted()
	}
	return Text(rawURL)
}

// Text masks the password of every URL in s.
func Text(s string) string {
	return userinfo.ReplaceAllString(s, "${1}:"+Mask+"@")
}

// Error is err with the passwords of the URLs in its message masked;
// errors.Is and errors.As still see err. A nil err stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	var r *redacted
	if errors.As(err, &r) && r == err {
		return err
	}
	return &redacted{err: err, msg: Text(err.Error())}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// Attr masks the passwords in a log attribute's string or error value: a
// slog.HandlerOptions.ReplaceAttr for every logger a command makes.
func Attr(_ []string, a slog.Attr) slog.Attr {
	switch v := a.Value; v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(Text(v.String()))
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			a.Value = slog.StringValue(Text(err.Error()))
		}
	}
	return a
}
