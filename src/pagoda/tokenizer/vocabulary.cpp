#include "pagoda/tokenizer/vocabulary.h"

namespace pagoda {

void Vocabulary::index() {
  id_of_piece.clear();
  id_of_piece.reserve(pieces.size());
  for (int32_t id = 0; id < size(); ++id) id_of_piece.emplace(pieces[id], id);
}

}  // namespace pagoda
