// Package filter is the subscription filter language of Pub/Sub: Parse
// reads a filter once, when its subscription is created or replayed, and
// Match judges a message by the body package wire encodes, allocating
// nothing.
package filter

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/broker/internal/wire"
	"github.com/dedupflow/dedupflow/limits"
)

// Filter is a parsed subscription filter, in the service's language:
//
//	attributes:KEY                  the key exists
//	attributes.KEY = "v"            the key exists with value v
//	attributes.KEY != "v"           the key is absent or has another value
//	hasPrefix(attributes.KEY, "p")  the key exists and its value starts with p
//	NOT x, -x, x AND y, x OR y, (x)
//
// KEY is a name of letters, digits, '_' and '-', or a string literal.
// String literals are in double quotes, with Go's escapes (\" \\ \n \xHH
// \ooo \uHHHH ...), which are the ones the service documents. AND and OR may
// not be mixed without parentheses, as in the service, and the operators are
// upper case. A subscription parses its filter once, when it is created;
// matching walks the message's encoded attributes and allocates nothing.
type Filter struct {
	op       filterOp
	key, val string
	kids     []*Filter // operands of and/or; the one operand of not
}

type filterOp uint8

const (
	opHas filterOp = iota
	opEq
	opNe
	opPrefix
	opNot
	opAnd
	opOr
)

// Match reports whether the message whose encoded data and attributes are
// body (see wire.Body) passes f. A nil filter passes everything.
func (f *Filter) Match(body []byte) bool {
	if f == nil {
		return true
	}
	switch f.op {
	case opHas:
		_, ok := wire.Attr(body, f.key)
		return ok
	case opEq:
		v, ok := wire.Attr(body, f.key)
		return ok && string(v) == f.val
	case opNe:
		v, ok := wire.Attr(body, f.key)
		return !ok || string(v) != f.val
	case opPrefix:
		v, ok := wire.Attr(body, f.key)
		return ok && strings.HasPrefix(string(v), f.val)
	case opNot:
		return !f.kids[0].Match(body)
	case opAnd:
		for _, k := range f.kids {
			if !k.Match(body) {
				return false
			}
		}
		return true
	case opOr:
		for _, k := range f.kids {
			if k.Match(body) {
				return true
			}
		}
	}
	return false
}

// Parse parses src; an empty src is no filter (nil). Errors name
// the byte offset where parsing failed.
func Parse(src string) (*Filter, error) {
	if len(src) > limits.FilterBytes {
		return nil, fmt.Errorf("the filter is %d bytes, the limit is %d", len(src), limits.FilterBytes)
	}
	if strings.TrimSpace(src) == "" {
		return nil, nil
	}
	p := &filterParser{src: src}
	f, err := p.expr()
	if err != nil {
		return nil, err
	}
	if p.skipSpace(); p.pos < len(src) {
		return nil, p.errorf("unexpected %s", p.found())
	}
	return f, nil
}

type filterParser struct {
	src string
	pos int
}

func (p *filterParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

// found describes what stands at the current position, for errors.
func (p *filterParser) found() string {
	if p.pos >= len(p.src) {
		return "end of filter"
	}
	rest := p.src[p.pos:]
	if w := p.peekWord(); w != "" {
		return strconv.Quote(w)
	}
	r, _ := utf8.DecodeRuneInString(rest)
	return strconv.QuoteRune(r)
}

func (p *filterParser) skipSpace() {
	for p.pos < len(p.src) && strings.IndexByte(" \t\r\n", p.src[p.pos]) >= 0 {
		p.pos++
	}
}

func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// peekWord returns the run of name bytes at the current position.
func (p *filterParser) peekWord() string {
	end := p.pos
	for end < len(p.src) && isNameByte(p.src[end]) {
		end++
	}
	return p.src[p.pos:end]
}

// keyword consumes w when it stands at the current position as a whole word.
func (p *filterParser) keyword(w string) bool {
	p.skipSpace()
	if p.peekWord() != w {
		return false
	}
	p.pos += len(w)
	return true
}

func (p *filterParser) punct(c byte) bool {
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == c {
		p.pos++
		return true
	}
	return false
}

// expr parses terms joined by one kind of operator: a AND b AND c, or
// a OR b OR c; a different operator at the same level is an error.
func (p *filterParser) expr() (*Filter, error) {
	first, err := p.unary()
	if err != nil {
		return nil, err
	}
	var join *Filter
	for {
		p.skipSpace()
		at := p.pos
		var op filterOp
		switch {
		case p.keyword("AND"):
			op = opAnd
		case p.keyword("OR"):
			op = opOr
		default:
			if w := p.peekWord(); strings.EqualFold(w, "AND") || strings.EqualFold(w, "OR") {
				return nil, p.errorf("%q: the operators AND, OR and NOT are written in upper case", w)
			}
			if join == nil {
				return first, nil
			}
			return join, nil
		}
		if join == nil {
			join = &Filter{op: op, kids: []*Filter{first}}
		} else if join.op != op {
			p.pos = at
			return nil, p.errorf("AND and OR cannot be mixed without parentheses")
		}
		next, err := p.unary()
		if err != nil {
			return nil, err
		}
		join.kids = append(join.kids, next)
	}
}

func (p *filterParser) unary() (*Filter, error) {
	p.skipSpace()
	if p.keyword("NOT") || p.punct('-') {
		f, err := p.unary()
		if err != nil {
			return nil, err
		}
		return &Filter{op: opNot, kids: []*Filter{f}}, nil
	}
	return p.primary()
}

func (p *filterParser) primary() (*Filter, error) {
	p.skipSpace()
	switch {
	case p.punct('('):
		f, err := p.expr()
		if err != nil {
			return nil, err
		}
		if !p.punct(')') {
			return nil, p.errorf("expected ')', found %s", p.found())
		}
		return f, nil
	case p.keyword("hasPrefix"):
		if !p.punct('(') {
			return nil, p.errorf("expected '(' after hasPrefix, found %s", p.found())
		}
		if !p.keyword("attributes") || !p.punct('.') {
			return nil, p.errorf("hasPrefix takes attributes.KEY first, found %s", p.found())
		}
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		if !p.punct(',') {
			return nil, p.errorf("expected ',' after the key in hasPrefix, found %s", p.found())
		}
		val, err := p.str()
		if err != nil {
			return nil, err
		}
		if !p.punct(')') {
			return nil, p.errorf("expected ')' to close hasPrefix, found %s", p.found())
		}
		return &Filter{op: opPrefix, key: key, val: val}, nil
	case p.keyword("attributes"):
		switch {
		case p.punct(':'):
			key, err := p.key()
			if err != nil {
				return nil, err
			}
			return &Filter{op: opHas, key: key}, nil
		case p.punct('.'):
			key, err := p.key()
			if err != nil {
				return nil, err
			}
			op := opEq
			p.skipSpace()
			switch {
			case strings.HasPrefix(p.src[p.pos:], "!="):
				p.pos += 2
				op = opNe
			case p.punct('='):
			default:
				return nil, p.errorf("expected = or != after attributes.%s, found %s", key, p.found())
			}
			val, err := p.str()
			if err != nil {
				return nil, err
			}
			return &Filter{op: op, key: key, val: val}, nil
		}
		return nil, p.errorf("expected ':' or '.' after attributes, found %s", p.found())
	}
	return nil, p.errorf("expected attributes:KEY, attributes.KEY, hasPrefix(...), NOT or '(', found %s", p.found())
}

// key parses an attribute key: a name or a string literal.
func (p *filterParser) key() (string, error) {
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '"' {
		return p.str()
	}
	w := p.peekWord()
	if w == "" {
		return "", p.errorf("expected an attribute key, found %s", p.found())
	}
	p.pos += len(w)
	return w, nil
}

// str parses a double-quoted string literal with Go's escapes.
func (p *filterParser) str() (string, error) {
	p.skipSpace()
	if p.pos >= len(p.src) || p.src[p.pos] != '"' {
		return "", p.errorf("expected a string in double quotes, found %s", p.found())
	}
	start := p.pos
	rest := p.src[p.pos+1:]
	var b strings.Builder
	for {
		if rest == "" {
			p.pos = start
			return "", p.errorf("the string that starts here has no closing quote")
		}
		if rest[0] == '"' {
			p.pos = len(p.src) - len(rest) + 1
			return b.String(), nil
		}
		r, multibyte, tail, err := strconv.UnquoteChar(rest, '"')
		if err != nil {
			p.pos = len(p.src) - len(rest)
			return "", p.errorf("invalid escape in a string")
		}
		if multibyte {
			b.WriteRune(r)
		} else {
			b.WriteByte(byte(r)) // \xHH and \ooo stand for bytes
		}
		rest = tail
	}
}
