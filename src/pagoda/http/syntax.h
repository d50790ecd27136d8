// The bits of RFC 9110 grammar that both the request parser and the response writer check.
#pragma once

#include <string_view>

namespace pagoda::http {

// A token (RFC 9110 5.6.2): methods, header names, Connection options. Non-empty.
bool is_token(std::string_view s);
// A header value (RFC 9110 5.5): visible ASCII, space, tab, and bytes >= 0x80 passed through as
// opaque. No CR, LF, NUL or other controls.
bool is_field_value(std::string_view s);
// ASCII case-insensitive equality (header names, Connection and Expect options).
bool iequals(std::string_view a, std::string_view b);
// Without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);

}  // namespace pagoda::http
