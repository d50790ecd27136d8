#include "pagoda/http/request.h"

namespace pagoda::http {

const std::string* Request::header(std::string_view lowercase_name) const {
  for (const Header& h : headers) {
    if (h.name == lowercase_name) return &h.value;
  }
  return nullptr;
}

}  // namespace pagoda::http
