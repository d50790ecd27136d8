// The chat page `pagoda serve` shows at `/`: one self-contained HTML file (no build step, no
// external scripts) that talks to /v1/chat/completions and shows the reply as it streams.
#pragma once

#include <string_view>

namespace pagoda::server {

std::string_view chat_page_html();

}  // namespace pagoda::server
